"""`python -m jaxlm.data {prepare,train-bpe,download,bench}`; see docs/data.md.

Bad input ends with one line on stderr naming the file, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxlm.errors import DataError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxlm.data", description="Tokenizer and data pipeline for jaxlm.")
    sub = p.add_subparsers(dest="command", required=True)

    pr = sub.add_parser("prepare", help="tokenise text files into train.bin / val.bin + meta.json")
    pr.add_argument("--input", nargs="+", required=True, metavar="FILE", help="text files (each a document), or 'pydoc'")
    pr.add_argument("--tokenizer", default="gpt2", help="gpt2 | bytes | directory with vocab.json + merges.txt")
    pr.add_argument("--out", required=True, metavar="DIR")
    val = pr.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=float, default=0.1, help="last fraction of the tokens kept for validation")
    val.add_argument("--val", nargs="+", metavar="FILE", help="separate validation files")
    pr.add_argument("--workers", type=int, default=None, help="encoding processes (default: all cores)")
    pr.add_argument("--dtype", choices=["uint16", "uint32"], default=None, help="default: uint16 when the vocabulary fits")

    tb = sub.add_parser("train-bpe", help="train a byte-level BPE tokenizer")
    tb.add_argument("--input", nargs="+", required=True, metavar="FILE")
    tb.add_argument("--vocab-size", type=int, required=True)
    tb.add_argument("--special-token", action="append", default=None, help="repeatable; default <|endoftext|>")
    tb.add_argument("--out", required=True, metavar="DIR")
    tb.add_argument("--workers", type=int, default=None)

    dl = sub.add_parser("download", help="download a public corpus")
    dl.add_argument("name", choices=["tinystories", "wikitext103", "openwebtext"])
    dl.add_argument("--out", required=True, metavar="DIR")
    dl.add_argument("--timeout", type=float, default=10.0)

    be = sub.add_parser("bench", help="benchmark BPE training, encoding and the loader")
    be.add_argument("--shared-data", default=None, metavar="DIR")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            from jaxlm.data.prepare import prepare

            meta = prepare(args.input, args.tokenizer, args.out, val_fraction=None if args.val else args.val_fraction, val_inputs=args.val, workers=args.workers, dtype=args.dtype)
            print(f"{args.out}: {meta['tokens']['train']:,} train + {meta['tokens']['val']:,} val tokens, {meta['dtype']}, vocab {meta['vocab_size']}, {meta['seconds']} s")
        elif args.command == "train-bpe":
            from jaxlm.data.bpe import train_and_save

            specials = args.special_token if args.special_token is not None else ["<|endoftext|>"]
            r = train_and_save(args.input, args.vocab_size, specials, args.out, num_workers=args.workers)
            print(f"{r['out']}: vocab {r['vocab_size']} ({r['merges']} merges) from {r['megabytes']:.2f} MB in {r['seconds']:.2f} s ({r['megabytes'] / r['seconds']:.2f} MB/s)")
        elif args.command == "download":
            from jaxlm.data.download import download

            for f in download(args.name, args.out, timeout=args.timeout):
                print(f)
        elif args.command == "bench":
            from jaxlm.data.bench import bench, format_table

            print(format_table(bench(args.shared_data)))
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
