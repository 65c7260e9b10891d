"""The CS336 tokenizer experiments, one measurement per call (`train`, `compress`, `throughput`): the `tokenizer`
plan (experiments/plans/tokenizer.toml says what each measures) runs them and `deliverables.report` turns their
RUN_DIR/tokenizer.json into its tables."""

from __future__ import annotations

import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

from jaxlm import cli
from jaxlm.core.files import write_json
from jaxlm.data.bpe import count_pretokens, save_vocab_merges, train_bpe
from jaxlm.data.corpora import corpus_file
from jaxlm.data.tokenizer import Tokenizer, load_tokenizer

EOT = "<|endoftext|>"
LARGEST = ("tinyshakespeare/input.txt", "wikitext-2/test.txt", "wikitext-2/valid.txt")  # 3.5 MB together
TEXTS = {"TinyStories (cs336 sample)": "cs336/tinystories_sample.txt", "WikiText-2 valid": "wikitext-2/valid.txt",
         "tiny Shakespeare": "tinyshakespeare/input.txt"}
BPE_TRAIN = "wikitext-2/test.txt"  # our BPEs for compression and speed: trained on the WikiText training stand-in
BPE_SIZES = (4096, 10000)


def train(run_dir: Path, fraction: float, vocab_size: int) -> dict:
    """BPE training on the first `fraction` of the LARGEST files joined by <|endoftext|>, one process: each phase's
    time (merging: the whole minus pre-tokenisation alone), the longest token, cProfile's top five of a second run."""
    text = EOT.join(corpus_file(s).read_text(encoding="utf-8") for s in LARGEST)
    path = run_dir / "text.txt"
    path.write_text(text[: int(len(text) * fraction)], encoding="utf-8")
    t0 = time.perf_counter()
    distinct = len(count_pretokens([path], [EOT], num_workers=1))
    pretokenize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    vocab, merges = train_bpe(path, vocab_size, [EOT], num_workers=1)
    total_s = time.perf_counter() - t0
    profile = cProfile.Profile()  # a second training, profiled: where the time goes, not how much
    profile.runcall(train_bpe, path, vocab_size, [EOT], num_workers=1)
    save_vocab_merges(run_dir / "bpe", vocab, merges)
    size = path.stat().st_size
    path.unlink()
    longest = max((t for i, t in vocab.items() if i > 0), key=len)  # id 0 is <|endoftext|>, not a learned token
    stats = pstats.Stats(profile)
    top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:5]  # by own (tottime) seconds
    return {"kind": "train", "bytes": size, "fraction": fraction, "vocab_size": vocab_size,
            "merges": len(merges), "distinct_pretokens": distinct, "pretokenize_s": pretokenize_s, "total_s": total_s,
            "merge_s": max(total_s - pretokenize_s, 0.0), "longest_token": longest.decode("utf-8", "replace"),
            "longest_token_bytes": len(longest),
            "profile_top": [{"function": f"{Path(f).name}:{line}({name})", "own_s": st[2], "cumulative_s": st[3]}
                            for (f, line, name), st in top], "profiled_total_s": stats.total_tt}


def tokenizers(run_dir: Path) -> dict[str, Tokenizer]:
    """Our BPEs trained on BPE_TRAIN (kept in RUN_DIR/bpeN) and GPT-2's."""
    out = {}
    for n in BPE_SIZES:
        vocab, merges = train_bpe(corpus_file(BPE_TRAIN), n, [EOT], num_workers=1)
        save_vocab_merges(run_dir / f"bpe{n}", vocab, merges)
        (run_dir / f"bpe{n}" / "special_tokens.json").write_text(json.dumps([EOT]))
        out[f"our BPE {n} (trained on {BPE_TRAIN})"] = load_tokenizer(run_dir / f"bpe{n}")
    out["GPT-2 (50257)"] = load_tokenizer("gpt2")
    return out


def compress(run_dir: Path) -> dict:
    rows = []
    for tname, tok in tokenizers(run_dir).items():
        for text_name, src in TEXTS.items():
            data = corpus_file(src).read_bytes()
            ids = tok.encode(data.decode("utf-8"))
            rows.append({"tokenizer": tname, "text": text_name, "bytes": len(data), "tokens": len(ids),
                         "bytes_per_token": len(data) / len(ids), "max_id": max(ids), "vocab_size": tok.vocab_size,
                         "uint16_bytes": 2 * len(ids), "uint32_bytes": 4 * len(ids)})
    return {"kind": "compress", "rows": rows}


def throughput(run_dir: Path, repeats: int) -> dict:
    text = corpus_file("wikitext-2/valid.txt").read_text(encoding="utf-8")
    size = len(text.encode("utf-8"))
    rows = []
    for tname, tok in tokenizers(run_dir).items():
        tok.encode(text[:10000])  # warm-up
        speeds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            tok.encode(text)
            speeds.append(size / (time.perf_counter() - t0))
        rows.append({"tokenizer": tname, "bytes": size, "bytes_per_s": speeds,
                     "mean_bytes_per_s": statistics.fmean(speeds)})
    return {"kind": "throughput", "text": "wikitext-2/valid.txt", "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.tokenizer_study", description=__doc__)
    p.add_argument("what", choices=["train", "compress", "throughput"])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--fraction", type=cli.bounded(float, 0.0, 1.0, open_low=True), default=1.0)
    p.add_argument("--vocab-size", type=cli.bounded(int, 258), default=10000)
    p.add_argument("--repeats", type=cli.bounded(int, 2), default=5)
    args = p.parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.what == "train":
        out = train(args.run_dir, args.fraction, args.vocab_size)
    else:
        out = compress(args.run_dir) if args.what == "compress" else throughput(args.run_dir, args.repeats)
    write_json(args.run_dir / "tokenizer.json", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main))

