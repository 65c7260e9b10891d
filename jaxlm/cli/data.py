"""`python -m jaxlm.data {prepare,train-bpe,list,download}`; see docs/data.md (benchmarks: `jaxlm.bench data`).

Bad input ends with one line on stderr naming the file or flag, exit status 2 (`jaxlm.cli.run`).
"""

from __future__ import annotations

from jaxlm import cli


def _parser() -> cli.ArgumentParser:
    from jaxlm.data.corpora import CORPORA, data_root

    fmt = cli.HelpFormatter
    p = cli.ArgumentParser(command="jaxlm.data", description="Tokenizer and data pipeline for jaxlm.",
                                epilog=f"data root: {data_root()} ($JAXLM_DATA, else ~/.cache/jaxlm/data)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pr = sub.add_parser("prepare", formatter_class=fmt,
                        needs="the core install (a Hugging Face tokenizer: the 'hf' extra)",
                        help="tokenise text into train.bin / val.bin + meta.json")
    pr.add_argument("--input", nargs="+", required=True, metavar="SOURCE",
                    help="corpus names (see `list`), text files (each a document), or 'pydoc'")
    pr.add_argument("--tokenizer", default="gpt2", help="gpt2 | bytes | directory with vocab.json + merges.txt")
    pr.add_argument("--out", required=True, metavar="DIR", help="directory to write the token files into")
    val = pr.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=cli.bounded(float, 0.0, 1.0, open_low=True, open_high=True), default=0.1,
                     help="last fraction of the tokens kept for validation")
    val.add_argument("--val", nargs="+", metavar="SOURCE", help="separate validation files or corpus names")
    pr.add_argument("--workers", type=cli.bounded(int, 1), default=None, help="encoding processes (default: all cores)")
    pr.add_argument("--dtype", choices=["uint16", "uint32"], default=None,
                    help="token dtype (default: uint16 when the vocabulary fits)")

    tb = sub.add_parser("train-bpe", formatter_class=fmt, needs="the core install",
                        help="train a byte-level BPE tokenizer")
    tb.add_argument("--input", nargs="+", required=True, metavar="SOURCE",
                    help="text files or corpus names to train on")
    tb.add_argument("--vocab-size", type=cli.bounded(int, 1), required=True,
                    help="final vocabulary size, special tokens included")
    tb.add_argument("--special-token", action="append", default=None, help="repeatable (default: <|endoftext|>)")
    tb.add_argument("--out", required=True, metavar="DIR", help="directory for vocab.json and merges.txt")
    tb.add_argument("--workers", type=cli.bounded(int, 1), default=None,
                    help="pre-tokenising processes (default: all cores)")

    sub.add_parser("list", needs="the core install",
                   help="list the corpora, their sizes and whether the data root has them")

    dl = sub.add_parser("download", formatter_class=fmt, needs="the core install (and the network)",
                        help="download corpora into the data root")
    dl.add_argument("name", nargs="+", choices=list(CORPORA), help="corpus names")
    dl.add_argument("--root", default=None, metavar="DIR",
                    help="data root (default: $JAXLM_DATA, else ~/.cache/jaxlm/data)")
    dl.add_argument("--timeout", type=cli.bounded(float, 0.0, open_low=True), default=10.0, metavar="S",
                    help="seconds to wait for the server before giving up")

    return p


def _list() -> str:
    from jaxlm.data.corpora import CORPORA, data_root

    rows = []
    for c in CORPORA.values():
        have = all((data_root() / c.name / f).is_file() for f in c.files)
        rows.append(f"{c.name:16} {'present' if have else 'missing':8} {c.about}")
    return "\n".join([f"corpora in {data_root()}:", *rows])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "prepare":
        from jaxlm.data.prepare import prepare

        meta = prepare(args.input, args.tokenizer, args.out, val_fraction=None if args.val else args.val_fraction,
                       val_inputs=args.val, workers=args.workers, dtype=args.dtype, culprit=f"--out {args.out}")
        print(f"{args.out}: {meta['tokens']['train']:,} train + {meta['tokens']['val']:,} val tokens, {meta['dtype']}, "
              f"vocab {meta['vocab_size']}, {meta['seconds']} s")
    elif args.command == "train-bpe":
        from jaxlm.data.bpe import train_and_save
        from jaxlm.data.corpora import resolve_sources

        specials = args.special_token if args.special_token is not None else ["<|endoftext|>"]
        cli.check_option(all(specials), "--special-token", "''", "an empty special token matches between every "
                         "two bytes, so no pair could merge; give its text, or leave the flag out for <|endoftext|>")
        r = train_and_save(resolve_sources(args.input), args.vocab_size, specials, args.out, num_workers=args.workers)
        print(f"{r['out']}: vocab {r['vocab_size']} ({r['merges']} merges) from {r['megabytes']:.2f} MB in "
              f"{r['seconds']:.2f} s ({r['megabytes'] / r['seconds']:.2f} MB/s)")
    elif args.command == "list":
        print(_list())
    elif args.command == "download":
        from jaxlm.data.corpora import download

        for name in args.name:
            for f in download(name, args.root, timeout=args.timeout):
                print(f)
    return 0
