"""One training run's page: learning curves, final numbers, a measured sample (docs/report.md)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from deliverables.report.output import images, report_dir
from deliverables.report.plots import plot_curves
from experiments.results import read_metrics, summarise_train
from jaxlm import cli
from jaxlm.core.errors import CheckpointError, DataError
from jaxlm.core.files import atomic_write

SAMPLE_TOKENS = 256


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "metrics.jsonl").is_file() and (Path(path) / "config.toml").is_file()


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("single training run (RUN_DIR with metrics.jsonl and config.toml)")
    g.add_argument("--prompt", help="prompt of the sample (default: the run's log.sample_prompt)")
    g.add_argument("--tokens", type=cli.bounded(int, SAMPLE_TOKENS), default=SAMPLE_TOKENS, metavar="N",
                   help=f"new tokens in the sample (>= {SAMPLE_TOKENS})")
    g.add_argument("--temperature", type=cli.bounded(float, 0.0), default=0.8, metavar="T",
                   help="sampling temperature; 0 = greedy")
    g.add_argument("--top-p", type=cli.bounded(float, 0.0, 1.0, open_low=True), default=0.95, metavar="P",
                   help="nucleus mass")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="sampling seed")


def fluency(tokens: list[int], text: str) -> list[str]:
    """Measured repetition of a sample: distinct token bigrams and the most repeated word 4-gram."""
    bigrams = list(zip(tokens, tokens[1:]))
    words = text.split()
    grams = Counter(tuple(words[i:i + 4]) for i in range(len(words) - 3))
    out = [f"{len(set(bigrams)) / len(bigrams):.0%} of its {len(bigrams)} token bigrams are distinct "
           "(a sample stuck in a loop scores low)"] if bigrams else []
    gram, n = grams.most_common(1)[0] if grams else ((), 0)
    out.append(f"its most repeated word 4-gram occurs {n} times (“{' '.join(gram)}”)" if n > 1
               else "no word 4-gram occurs twice")
    return out


def sample(run_dir: Path, prompt: str | None, args: argparse.Namespace) -> tuple[list[str], str]:
    """(Markdown lines, the decoding line) for a sample from the run's latest checkpoint."""
    from jaxlm.nn.decode import Generator, SamplingParams, encode_prompt
    from jaxlm.training.checkpoint import load_for_generation, read_run_config, saved_steps

    model, tok = load_for_generation(run_dir)
    text_prompt = prompt if prompt is not None else read_run_config(run_dir).log.sample_prompt
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    out = Generator(model).generate([encode_prompt(tok, text_prompt)], args.tokens, sampling, seed=args.seed,
                                    eot_id=None)
    new = out.tokens[0]
    text = tok.decode(new)
    how = (f"newest checkpoint (step {max(saved_steps(run_dir))}), prompt {text_prompt!r}, {len(new)} new tokens, "
           f"temperature {args.temperature:g}, top-p {args.top_p:g}, top-k off, seed {args.seed}, KV cache "
           f"(`jaxlm.nn.decode.Generator`; the window slides past {model.cfg.context_length} tokens)")
    lines = ["```text", (text_prompt + text).replace("```", "'''"), "```", ""]
    measured = fluency(new, text)
    if measured:
        lines += ["Repetition, measured: " + "; ".join(measured) + ".", ""]
    return lines, how


def run_summary(run_dir: Path, records: list[dict]) -> list[str]:
    from jaxlm.analysis.flops import param_counts
    from jaxlm.core.config import load_config

    cfg = load_config(run_dir / "config.toml")
    m, s = cfg.model, summarise_train(records)
    f = lambda k, how="{:.3f}": how.format(s[k]) if k in s else "–"
    rows = [("model", f"d_model {m.d_model}, {m.num_layers} layers, {m.num_heads} heads, d_ff {m.d_ff}, "
                      f"vocab {m.vocab_size}, context {m.context_length}: {param_counts(m)['total']:,} parameters"),
            ("data", f"`{cfg.data.dir}` ({cfg.data.tokenizer} tokenizer), batch {cfg.data.batch_size}"),
            ("optimizer", f"AdamW lr {cfg.optim.lr:g} (min {cfg.optim.min_lr:g}), warmup {cfg.optim.warmup_steps}"
                          + (" (at the end; changes below)" if "config_changes" in s else "")),
            ("compute", f"{cfg.compute.dtype}, attention {cfg.compute.attention}, remat {cfg.compute.remat}"),
            ("steps", f("steps", "{}")), ("final train loss", f("train_loss")),
            ("final validation loss", f("eval_loss")),
            ("best validation loss", f("best_eval_loss")), ("validation perplexity", f("eval_ppl", "{:.2f}")),
            ("tokens/s (median)", f("tokens_per_s", "{:,.0f}")),
            ("wall time (its invocations, not the gaps between them)", f("logged_time_s", "{:.1f} s"))]
    rows += [(f"config changed at step {step}", ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))
             for step, changed in s.get("config_changes", [])]
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), ""]


def write_run_report(run_dir: Path, out: Path, args: argparse.Namespace) -> Path:
    records = read_metrics(run_dir / "metrics.jsonl")
    if not records:
        raise DataError(f"{run_dir / 'metrics.jsonl'}: holds no records; train the run first")
    report_dir(out)
    lines = [f"# Training run `{run_dir.name}`", "", f"Generated by `python -m deliverables.report {run_dir}` from its "
             "metrics.jsonl, config.toml and latest checkpoint.", ""] + run_summary(run_dir, records)
    curves = plot_curves([{"name": run_dir.name, "_dir": str(run_dir), "status": "ok"}], out)
    lines += ["## Learning curves", "", *images(curves), "## Sample", ""]
    try:
        body, how = sample(run_dir, args.prompt, args)
        lines += [f"Decoding: {how}.", ""] + body
    except CheckpointError as e:
        lines += [f"No sample: {e}.", ""]
    return atomic_write(out / "report.md", "\n".join(lines))
