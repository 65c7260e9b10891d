"""The tokenizer study's tables (docs/experiments.md, *The tokenizer plan*) from its runs' tokenizer.json."""

from __future__ import annotations

import math
from statistics import linear_regression

from deliverables.common import table
from deliverables.report.format import fmt
from deliverables.report.seeds import Stats, run_json

PILE_BYTES = 825e9
# Corpora the CS336 assignment trains its tokenizers on: (bytes of the train split, vocabulary).
TARGETS = {"TinyStories V2 train": (2.2e9, 10000), "OpenWebText sample train": (11e9, 32000)}


def study_rows(runs: list[dict], kind: str) -> list[tuple[dict, dict]]:
    """(run, its tokenizer.json) of the plan's completed runs of `kind`."""
    return [(r, data) for r, data in run_json(runs, "tokenizer.json")
            if r.get("status") == "ok" and isinstance(data, dict) and data.get("kind") == kind]


def extrapolation(train: list[tuple[dict, dict]]) -> list[str]:
    """Pre-tokenisation time linear in bytes; distinct pre-tokens by Heaps' law (a power of bytes, fitted
    in log-log); merge time and peak memory linear in the distinct pre-tokens (merging walks the words)."""
    if len(train) < 3:
        return ["Extrapolation needs at least three training sizes."]
    b = [t["bytes"] for _, t in train]
    d = [t["distinct_pretokens"] for _, t in train]
    per_byte = linear_regression(b, [t["pretokenize_s"] for _, t in train], proportional=True).slope
    beta, log_k = linear_regression([math.log(x) for x in b], [math.log(x) for x in d])
    per_word = linear_regression(d, [t["merge_s"] for _, t in train], proportional=True).slope
    rss = [(dd, r["max_rss_bytes"]) for (r, _), dd in zip(train, d) if r.get("max_rss_bytes")]
    mem = linear_regression(*zip(*rss))[::-1] if len(rss) >= 2 else None  # (intercept, slope)
    out = [f"Fits over the {len(train)} sizes: pre-tokenisation {per_byte * 1e6:.3g} s per MB; distinct pre-tokens "
           f"{math.exp(log_k):.3g} x bytes^{beta:.3f} (Heaps' law); merging {per_word * 1e3:.3g} ms per distinct "
           "pre-token at vocabulary 10000" + (f"; peak memory {fmt(mem[0], 'bytes')} + {mem[1]:.3g} B per distinct "
                                              "pre-token" if mem else "") + "."]
    for name, (size, vocab) in TARGETS.items():
        words = math.exp(log_k) * size ** beta
        seconds = per_byte * size + per_word * words * vocab / 10000  # merges assumed linear in their number
        memory = f", peak memory about {fmt(mem[0] + mem[1] * words, 'bytes')}" if mem else ""
        out.append(f"{name} ({size / 1e9:.1f} GB, vocabulary {vocab}): about {words:,.0f} distinct pre-tokens, "
                   f"{seconds / 3600:.2g} hours in one process ({per_byte * size / 3600:.2g} h pre-tokenising)"
                   f"{memory}. An extrapolation over {size / max(b):,.0f}x the largest measured text: an order of "
                   "magnitude, not a measurement.")
    return out


def training_lines(train: list[tuple[dict, dict]]) -> list[str]:
    rows = [[fmt(t["bytes"], "bytes"), f"{t['distinct_pretokens']:,}", f"{t['pretokenize_s']:.2f}",
             f"{t['merge_s']:.2f}", f"{t['total_s']:.2f}", fmt(r.get("max_rss_bytes"), "bytes"),
             f"`{t['longest_token']!r}` ({t['longest_token_bytes']} B)"] for r, t in train]
    full = train[-1][1]
    top = full["profile_top"][0]
    share = 100 * full["merge_s"] / full["total_s"]
    return ["### BPE training", "",
            table(["text", "distinct pre-tokens", "pre-tokenise s", "merge s", "total s", "peak RSS", "longest token"],
                  rows), "",
            f"One process (`num_workers=1`), vocabulary {full['vocab_size']} with `<|endoftext|>`; merge time is "
            "the whole training minus a separate pre-tokenisation of the same text; peak RSS is the whole Python "
            f"process. On all {fmt(full['bytes'], 'bytes')}, merging took {share:.0f} % of the time; in the "
            f"profiled training the most expensive function by its own time is `{top['function']}` "
            f"({top['own_s']:.2f} s of {full['profiled_total_s']:.2f} s, cProfile overhead included).", "",
            *[f"- {s}" for s in extrapolation(train)], ""]


def compression_lines(rows: list[dict]) -> list[str]:
    body = [[r["tokenizer"], r["text"], fmt(r["bytes"], "bytes"), f"{r['tokens']:,}", f"{r['bytes_per_token']:.2f}"]
            for r in rows]
    wiki = [r for r in rows if r["text"] == "WikiText-2 valid"]
    dtype = [f"- {r['tokenizer']}: largest id {r['max_id']:,} of a {r['vocab_size']:,}-entry vocabulary, "
             f"{'within' if r['vocab_size'] <= 65536 else 'beyond'} uint16's 65,536 values; WikiText-2 valid as uint16 "
             f"{fmt(r['uint16_bytes'], 'bytes')} (uint32 {fmt(r['uint32_bytes'], 'bytes')}), against "
             f"{fmt(r['bytes'], 'bytes')} of text." for r in wiki]
    return ["### Bytes per token", "", table(["tokenizer", "text", "bytes", "tokens", "bytes per token"], body), "",
            "### Why uint16", "",
            "Every id of these vocabularies is below 65,536, so a token fits in 2 bytes: uint16 halves the token "
            "files (and the memory-mapped reads) against uint32, and `jaxlm.data prepare` picks uint32 only for a "
            "larger vocabulary.", "", *dtype, ""]


def throughput_lines(rows: list[dict], text: str) -> list[str]:
    body = []
    for r in rows:
        st = Stats.of(r["bytes_per_s"])
        hours = PILE_BYTES / st.mean / 3600
        body.append([r["tokenizer"], f"{st.mean / 1e6:.2f} ± {st.ci / 1e6:.2f}", str(st.n),
                     f"{hours:,.0f} h ({hours / 24:.1f} days)"])
    return ["### Encoding throughput", "",
            table(["tokenizer", "MB/s (95 % interval)", "repeats", "825 GB (the Pile), one process"], body), "",
            f"Encoding `{text}` whole, one process; every tokenizer here runs the same tiktoken-backed code "
            "(`jaxlm.data.tokenizer.Tokenizer`). The Pile's time divides by the number of processes: `jaxlm.data "
            "prepare` encodes chunks in parallel workers.", ""]


def tokenizer(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(findings, lines) of the tokenizer study."""
    train = sorted(study_rows(runs, "train"), key=lambda rt: rt[1]["bytes"])
    lines = training_lines(train) if train else []
    for _, data in study_rows(runs, "compress"):
        lines += compression_lines(data["rows"])
    for _, data in study_rows(runs, "throughput"):
        lines += throughput_lines(data["rows"], data["text"])
    return [], (["## Tokenizer experiments", ""] + lines if lines else [])
