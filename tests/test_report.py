"""experiments.report on one training run (learning curves + a 256-token sample) and --all over every plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.report import __main__ as report
from experiments.results import read_metrics, summarise_train
from jaxlm import cli
from jaxlm.core.config import load_config
from tests.train_helpers import make_corpus, tiny_overrides


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    from jaxlm.training.loop import train

    tmp = tmp_path_factory.mktemp("run")
    train(load_config(None, tiny_overrides(make_corpus(tmp / "data"), tmp / "run")))
    return tmp / "run"


def test_single_run_page_has_curves_numbers_and_a_256_token_sample(tiny_run, tmp_path):
    from experiments.report.run_page import fluency
    from jaxlm.nn.decode import Generator, SamplingParams, encode_prompt
    from jaxlm.training.checkpoint import load_for_generation

    out = tmp_path / "page"
    assert cli.run(report.main, [str(tiny_run), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    for png in ("curves_by_step.png", "curves_by_time.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in text
    final = summarise_train(read_metrics(tiny_run / "metrics.jsonl"))
    assert f"| final validation loss | {final['eval_loss']:.3f} |" in text
    assert "256 new tokens, temperature 0.8, top-p 0.95, top-k off, seed 0" in text
    # The page's sample is exactly what the Generator gives with those settings.
    model, tok = load_for_generation(tiny_run)
    new = Generator(model).generate([encode_prompt(tok, "The ")], 256, SamplingParams(0.8, 0, 0.95), seed=0).tokens[0]
    assert len(new) == 256
    assert "The " + tok.decode(new) in text.replace("'''", "```")
    assert fluency(new, tok.decode(new))[0] in text


def test_fluency_measures_repetition():
    from experiments.report.run_page import fluency

    lines = fluency([1, 2] * 10, "a b c d " * 5)
    assert lines[0].startswith("11% of its 19 token bigrams") and "occurs 5 times" in lines[1]


def test_single_run_options_are_checked(tiny_run, capsys):
    assert cli.run(report.main, [str(tiny_run), "--tokens", "10"]) == 2
    assert "--tokens" in capsys.readouterr().err


# --------------------------------------------------------------------------- --all


def _record(root: Path, plan: str, name: str, **fields) -> dict:
    run = root / plan / name
    run.mkdir(parents=True)
    rec = {"name": name, "plan": plan, "status": "ok", "device": "cpu", "platform": "cpu", "device_count": 1,
           "host": {"cpus": 2}, "versions": {"python": "3.12.0", "jax": "0.0.test"}, **fields}
    (run / "result.json").write_text(json.dumps(rec))
    return rec


def _synthetic_root(root: Path) -> None:
    model = {"vocab_size": 257, "context_length": 32, "d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64}
    data = {"tokenizer": "bytes", "vocab_size": 257, "tokens": {"train": 123456, "val": 7890}, "sources": ["tiny/input.txt"]}
    rows = [{"framework": "jax", "mode": "train_step", "dtype": dt, "attention": "xla", "remat": "none", "context": t,
             "batch": b, "status": "ok", "step_ms": 10.0 * b * t / 64, "memory_gb": 0.5 * t / 64 * b,
             "tokens_per_s": (2000 if dt == "bfloat16" else 1000) * b ** 0.5}
            for dt in ("float32", "bfloat16") for t in (64, 128, 256) for b in (1, 2, 4)]
    _record(root, "profiling", "sweep", kind="bench", bench_rows=rows)
    for name, tps, mem, loss in (("baseline-s0", 1000.0, 4e9, 2.5), ("bf16-s0", 1900.0, 3e9, 2.51)):
        rec = _record(root, "optimizations", name, kind="train", axes={"opt": name[:-3]}, config={"model": model}, data=data,
                      metrics={"tokens_per_s": tps, "peak_memory": mem, "eval_loss": loss, "train_loss": loss, "steps": 10})
        lines = [{"kind": "train", "step": s, "time": 100.0 + s, "train/loss": loss + 1 / s} for s in range(1, 11)]
        (root / "optimizations" / rec["name"] / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)))
    _record(root, "lora_finetune", "rank8", kind="train", metrics={"eval_loss": 3.21, "steps": 5})
    (root / "optimizations" / "plan.json").write_text(json.dumps({"name": "optimizations", "runs": [{"name": "baseline-s0"}, {"name": "bf16-s0"}],
                                                                  "report": {"baseline": {"opt": "baseline"}}}))


def test_all_plans_report_sections_plots_and_missing_plans(tmp_path):
    root, out = tmp_path / "results", tmp_path / "report"
    _synthetic_root(root)
    (out / "learning_curve").mkdir(parents=True)
    (out / "learning_curve" / "report.md").write_text("# Training run `x`\n\n![curves](curves_by_step.png)\n")
    (root / "lr_sweep").mkdir()
    (root / "lr_sweep" / "report.md").write_text("# an old report without records\n")
    assert cli.run(report.main, ["--all", str(root), "--out", str(out)]) == 0
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    heads = ["## 1. Experimental setup", "## 2. Profiling results", "## 3. Background", "## 4. Trade-off analysis",
             "## 5. Extras", "## 6. Training studies", "## 7. Findings against the curriculum", "## 8. Limitations"]
    assert [md.index(h) for h in heads] == sorted(md.index(h) for h in heads)
    assert "| tiny/input.txt | bytes | 123,456 | 7,890 | optimizations |" in md
    from jaxlm.analysis.flops import param_counts
    from jaxlm.core.config import ModelConfig

    n = param_counts(ModelConfig(vocab_size=257, context_length=32, d_model=32, num_layers=2, num_heads=2, d_ff=64))["total"]
    assert f"| 32 | 2 | 2 | 64 | 257 | 32 | {n:,} | optimizations |" in md
    assert "### GPU results\n\n**Pending**: no run under this root ran on a GPU" in md
    assert "- jax 0.0.test" in md and "**pending**: no run under this root ran on a GPU" in md
    for png in ("memory_vs_context", "throughput_vs_batch", "before_after"):
        assert (out / "figures" / f"{png}.png").stat().st_size > 1000 and f"(figures/{png}.png)" in md
    # memory 0.5 GB x T/64 x B: 4x from T=64 to 256 at every batch
    assert "jax train_step float32 xla none batch=1: from T 64 to 256 (4x) peak memory went 4.00x (477 MiB to 1.86 GiB)" in md
    assert "- bf16: tokens/s +90%, peak memory (GB) -25%" in md
    extras, studies = md.index("## 5. Extras"), md.index("## 6. Training studies")
    assert extras < md.index("(`lora_finetune`)") < studies and "| `rank8` | ok | 5 | 3.210 |" in md[extras:studies]
    assert "[lr_sweep/report.md](../results/lr_sweep/report.md), was written from runs whose records are not kept" in md
    assert "### Learning curve and sample: training run `x`\n\n![curves](learning_curve/curves_by_step.png)" in md[studies:]
    assert "**Missing**: no result.json under" in md and "`lr_sweep`" in md and "**Missing**: no plan whose name contains `parallel`" in md
    assert md.count("data:image") == 0 and html.count("data:image/png;base64,") >= 3 and "<table>" in html
    assert '<img alt="before and after" src="data:image/png;base64,' in html


def test_all_needs_out(tmp_path, capsys):
    assert cli.run(report.main, ["--all", str(tmp_path)]) == 2
    assert "--all" in capsys.readouterr().err


def test_findings_of_every_plan_in_one_table_with_the_tally(tmp_path):
    from experiments.report.written import findings_section

    for plan, verdicts in (("ablations", ["agree", "disagree"]), ("lr_sweep", ["agree"])):
        (tmp_path / "plans" / plan).mkdir(parents=True)
        rows = [{"claim": f"{plan} claim {i}", "seen": "s", "measured": "m", "verdict": v} for i, v in enumerate(verdicts)]
        (tmp_path / "plans" / plan / "findings.json").write_text(json.dumps({"plan": plan, "findings": rows}))
    text = "\n".join(findings_section(tmp_path, ["ablations", "lr_sweep", "model_size"]))
    assert "3 published findings checked: 2 agree, 1 disagree." in text
    assert "| `ablations` | ablations claim 1 | s | m | disagree |" in text and "| `lr_sweep` | lr_sweep claim 0 |" in text
    assert "No plan report" in "\n".join(findings_section(tmp_path, ["model_size"]))


def test_before_after_prefers_the_bench_rows_and_falls_back_to_training_runs():
    from experiments.report.figures import before_after_bars

    def bench(tech, tps, mem):
        return {"name": f"before_after_{tech}", "plan": "optimizations", "status": "ok", "kind": "bench", "axes": {"technique": tech},
                "bench_rows": [{"status": "ok", "tokens_per_s": tps, "memory_gb": mem, "step_ms": 100.0}]}

    def train(tech, seed, tps, rss):
        return {"name": f"{tech}_b32-s{seed}", "plan": "optimizations", "status": "ok", "kind": "train",
                "axes": {"technique": tech}, "max_rss_bytes": rss, "metrics": {"tokens_per_s": tps, "step_time": 0.5}}

    runs = [train("float32", 0, 100.0, 2e9), train("float32", 1, 300.0, 4e9), train("remat", 0, 150.0, 1e9)]
    assert before_after_bars(runs) == {"float32": {"tokens_per_s": 200.0, "memory_gb": 3.0, "step_ms": 500.0},
                                       "remat": {"tokens_per_s": 150.0, "memory_gb": 1.0, "step_ms": 500.0}}
    runs += [bench("float32", 1000.0, 8.0), bench("bfloat16", 2500.0, 5.0)]
    assert before_after_bars(runs) == {"float32": {"tokens_per_s": 1000.0, "memory_gb": 8.0, "step_ms": 100.0},
                                       "bfloat16": {"tokens_per_s": 2500.0, "memory_gb": 5.0, "step_ms": 100.0}}


def test_gpu_campaign_report_is_included(tmp_path):
    from experiments.report.written import gpu_section

    (tmp_path / "results" / "gpu").mkdir(parents=True)
    (tmp_path / "results" / "gpu" / "report.md").write_text("# GPU campaign\n\n## Attention\n\n![a](attention.png)\n")
    text = "\n".join(gpu_section([], tmp_path / "results", tmp_path / "report"))
    assert "#### GPU campaign" in text and "##### Attention" in text and "![a](../results/gpu/attention.png)" in text
    assert "**Pending**" in "\n".join(gpu_section([], tmp_path / "nothing", tmp_path / "report"))


def test_html_renders_tables_inside_details(tmp_path):
    from experiments.report.written import to_html

    html = to_html("# t\n\n<details><summary>Every run</summary>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n</details>\n", tmp_path)
    assert "<summary>Every run</summary>" in html and "<td>1</td>" in html
