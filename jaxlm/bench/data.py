"""`python -m jaxlm.bench data`: BPE training, GPT-2 encoding through `prepare`, loader batches/s.

Inputs are the corpora tinyshakespeare (input.txt) and wikitext-2 (valid.txt + test.txt),
3.4 MB, from the data root (see jaxlm.data.corpora). Each figure is the best of `repeats` runs after one warm-up
where that matters (loader). Needs the core install.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from jaxlm import cli
from jaxlm.bench.timing import time_calls
from jaxlm.data.bpe import train_bpe
from jaxlm.data.corpora import corpus_files


def bench(root: str | os.PathLike | None = None, vocab_size: int = 10000, batch_size: int = 32,
          context_length: int = 256, repeats: int = 3, loader_batches: int = 3000) -> list[tuple[str, str, str]]:
    """(benchmark, time, throughput) rows; each time is the best of `repeats` runs."""
    files = corpus_files("tinyshakespeare", root) + corpus_files("wikitext-2", root, which="all")
    mb = sum(f.stat().st_size for f in files) / 1e6
    cores = os.cpu_count() or 1
    rows = []

    best = min(time_calls(lambda: train_bpe(files, vocab_size, ["<|endoftext|>"]), repeats).seconds)
    rows.append((f"BPE training, vocab {vocab_size}, {mb:.1f} MB, {cores} workers", f"{best:.2f} s",
                 f"{mb / best:.2f} MB/s"))

    from jaxlm.data.loader import train_batches
    from jaxlm.data.prepare import prepare
    from jaxlm.data.tokenizer import load_tokenizer

    load_tokenizer("gpt2")  # build once; prepare's own load then hits the cache
    with tempfile.TemporaryDirectory() as tmp:
        best = min(time_calls(lambda: prepare([str(f) for f in files], "gpt2", tmp, progress=False), repeats).seconds)
        rows.append((f"GPT-2 encoding via prepare, {mb:.1f} MB (one process below 16 MB)", f"{best:.2f} s",
                     f"{mb / best:.2f} MB/s"))

        big = Path(tmp) / "x8.txt"  # large enough for worker processes
        with open(big, "wb") as f:
            for _ in range(8):
                for src in files:
                    f.write(src.read_bytes())
        big_mb = big.stat().st_size / 1e6
        out8 = Path(tmp) / "x8"
        best = min(time_calls(lambda: prepare([str(big)], "gpt2", out8, progress=False), repeats).seconds)
        rows.append((f"GPT-2 encoding via prepare, same text x8 = {big_mb:.0f} MB, {cores} workers", f"{best:.2f} s",
                     f"{big_mb / best:.2f} MB/s"))

        it = train_batches(tmp, batch_size, context_length, seed=0)
        for _ in range(100):
            next(it)
        (t,) = time_calls(lambda: [next(it) for _ in range(loader_batches)], 1).seconds
        it.close()
        rows.append((f"loader, batch {batch_size} x {context_length}, {loader_batches} batches", f"{t:.2f} s",
                     f"{loader_batches / t:,.0f} batches/s"))
    return rows


def format_table(rows: list[tuple[str, str, str]]) -> str:
    header = ("benchmark", "time", "throughput")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.add_argument("--root", metavar="DIR", help="data root holding the corpora tinyshakespeare and wikitext-2 "
                   "(default: $JAXLM_DATA, else ~/.cache/jaxlm/data)")
    p.add_argument("--vocab-size", metavar="N", type=int, default=10000,
                   help="BPE vocabulary to train (> 256 + special tokens)")
    p.add_argument("--batch", metavar="N", type=int, default=32, help="loader batch size in sequences")
    p.add_argument("--context", metavar="N", type=int, default=256, help="loader sequence length")
    p.add_argument("--repeats", metavar="N", type=int, default=3, help="runs per figure (the best is kept)")
    p.add_argument("--loader-batches", metavar="N", type=int, default=3000, help="batches timed for the loader figure")


def main(args: argparse.Namespace) -> int:
    cli.check_option(args.vocab_size > 257, "--vocab-size", args.vocab_size,
                     "must be > 257 (256 bytes + <|endoftext|>)")
    for flag in ("--batch", "--context", "--repeats", "--loader-batches"):
        value = getattr(args, flag[2:].replace("-", "_"))
        cli.check_option(value >= 1, flag, value, "must be >= 1")
    print(format_table(bench(args.root, args.vocab_size, args.batch, args.context, args.repeats,
                             args.loader_batches)))
    return 0
