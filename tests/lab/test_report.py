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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    from jaxlm.training.loop import train

    tmp = tmp_path_factory.mktemp("run")
    train(load_config(None, tiny_overrides(make_corpus(tmp / "data"), tmp / "run", **{"log.sample_tokens": 8})))
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
    md, html = (out / "appendix.md").read_text(), (out / "appendix.html").read_text()
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
    short = (out / "report.md").read_text()
    for png in ("memory_vs_context", "throughput_vs_batch", "before_after"):
        assert (out / "figures" / f"{png}.png").stat().st_size > 1000 and f"(figures/{png}.png)" in short
    # memory 0.5 GB x T/64 x B: 4x from T=64 to 256 at every batch
    assert "train_step float32, batch=1 (measured): from T 64 to 256 (4x) peak memory went 4.00x (477 MiB to 1.86 GiB)" in short
    assert "- bf16: tokens/s +90% (no interval), peak memory (GB) -25% (no interval)" in short  # one seed each
    assert "The three required plots are in the [report](report.md)." in md
    extras, studies = md.index("## 5. Extras"), md.index("## 6. Training studies")
    assert extras < md.index("(`lora_finetune`)") < studies and "| `rank8` | ok | 5 | 3.210 |" in md[extras:studies]
    assert "[lr_sweep/report.md](../results/lr_sweep/report.md), was written from runs whose records are not kept" in md
    assert "### Learning curve and sample: training run `x`\n\n![curves](learning_curve/curves_by_step.png)" in md[studies:]
    assert "**Missing**: no result.json under" in md and "`lr_sweep`" in md and "**Missing**: no plan whose name contains `parallel`" in md
    assert md.count("data:image") == 0 and "<table>" in html and '<a href="report.html">report</a>' in html
    short_html = (out / "report.html").read_text()
    assert short_html.count("data:image/png;base64,") >= 3 and '<img alt="before and after" src="data:image/png;base64,' in short_html
    assert '<a href="appendix.html">appendix</a>' in short_html


def test_the_report_is_the_template_filled_in_with_computed_numbers(tmp_path):
    root, out = tmp_path / "results", tmp_path / "report"
    _synthetic_root(root)
    assert cli.run(report.main, ["--all", str(root), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    heads = ["## 1. Setup", "## 2. Background", "## 3. Trade-offs", "### 3.1 Memory", "### 3.2 Speed", "### 3.3 Accuracy",
             "## 4. Findings", "## 5. What could not be measured, and why"]
    assert [md.index(h) for h in heads] == sorted(md.index(h) for h in heads)
    assert "$" not in md.replace("$$", "")  # every template field was filled
    assert "[appendix](appendix.md)" in md and "`tiny/input.txt` (bytes tokenizer; 123,456 training and 7,890 validation tokens" in md
    assert "jax 0.0.test" in md and "[remat](" in md  # the software the records name; the technique index, linked
    assert len(md.split()) <= 2600


def test_the_committed_report_keeps_its_budget_and_links_its_appendix():
    docs = Path(__file__).resolve().parents[2] / "docs" / "report"
    md = (docs / "report.md").read_text()
    assert len(md.split()) <= 2600, "docs/report/report.md is over about 2,500 words: move detail to the appendix"
    assert "[appendix](appendix.md)" in md and (docs / "appendix.md").is_file()  # the HTML/PDF are generated, not kept


def test_pdf_goes_with_all_only(tmp_path, capsys):
    assert cli.run(report.main, [str(tmp_path), "--pdf"]) == 2
    assert "--pdf" in capsys.readouterr().err


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

    def means(bars):
        return {k: {q: st.mean for q, st in qs.items()} for k, qs in bars.items()}

    runs = [train("float32", 0, 100.0, 2e9), train("float32", 1, 300.0, 4e9), train("remat", 0, 150.0, 1e9)]
    bars = before_after_bars(runs)
    assert means(bars) == {"float32": {"tokens_per_s": 200.0, "memory_gb": 3.0, "step_ms": 500.0},
                           "remat": {"tokens_per_s": 150.0, "memory_gb": 1.0, "step_ms": 500.0}}
    assert bars["float32"]["tokens_per_s"].ci == pytest.approx(12.706 * 141.42 / 2 ** 0.5, rel=1e-3)  # t(0.975, 1) = 12.706
    runs += [bench("float32", 1000.0, 8.0), bench("bfloat16", 2500.0, 5.0)]
    assert means(before_after_bars(runs)) == {"float32": {"tokens_per_s": 1000.0, "memory_gb": 8.0, "step_ms": 100.0},
                                              "bfloat16": {"tokens_per_s": 2500.0, "memory_gb": 5.0, "step_ms": 100.0}}


def _bench_run(name, steps, rows):
    return {"name": name, "plan": "optimizations", "status": "ok", "kind": "bench", "spec": {"args": {"steps": steps}},
            "bench_rows": [{"status": "ok", "framework": "jax", "mode": "train_step", "dtype": "float32", "attention": "xla",
                            "remat": "none", "device": "cpu", **r} for r in rows]}


def test_required_figures_keep_models_apart_with_intervals(tmp_path):
    from experiments.report.figures import before_after, bench_rows, memory_vs_context, throughput_vs_batch

    # Two models (100k and 400k parameters) at batch 1 and 2, context 64; 5 timed steps, step-time std 2 ms (n-divided)
    small = [{"params": 100_000, "context": 64, "batch": b, "step_ms": 10.0 * b, "step_ms_std": 2.0,
              "tokens_per_s": 6400.0, "memory_gb": 0.1 * b} for b in (1, 2)]
    big = [{**r, "params": 400_000, "step_ms": 40.0 * r["batch"], "tokens_per_s": 1600.0} for r in small]
    rows = bench_rows([_bench_run("sweep", 5, small + big)])
    text = "\n".join(throughput_vs_batch(rows, tmp_path))
    assert "measured on CPU" in text and (tmp_path / "throughput_vs_batch.png").is_file()
    # one line per model: neither joins 100k to 400k (both stay flat)
    assert "100k params, train_step float32, context=64 (CPU): from B 1 to 2 (2x) throughput went 1.00x" in text
    assert "400k params, train_step float32, context=64 (CPU): from B 1 to 2 (2x) throughput went 1.00x" in text
    # a run that set compute.loss_chunk is another setting: its batch-3 row does not extend the 100k line
    chunked = _bench_run("maxbatch_chunked", 5, [{**small[0], "batch": 3, "tokens_per_s": 9000.0}])
    chunked["spec"]["set"] = {"compute.loss_chunk": 1024, "model.d_model": 8}
    text = "\n".join(throughput_vs_batch(rows + bench_rows([chunked]), tmp_path))
    assert "100k params, train_step float32, context=64 (CPU): from B 1 to 2 (2x)" in text and "B 1 to 3" not in text
    # 95 % half-width of a 10 ms step: 2.776 x (2 x sqrt(5/4)) / sqrt(5) = 2.776 ms
    assert rows[0]["step_ms_ci95"] == pytest.approx(2.776, abs=1e-3)
    longer = bench_rows([_bench_run("long", 5, [{**small[0], "context": 128, "memory_gb": 0.3}])])
    mem = "\n".join(memory_vs_context(rows + longer, tmp_path))
    assert "pending" in mem and "100k params, train_step float32, batch=1 (memory_analysis)" not in mem  # no source named
    assert "100k params, train_step float32, batch=1 (measured): from T 64 to 128 (2x) peak memory went 3.00x" in mem
    gpu = [{**r, "memory_gb": None, "total_gb": 0.5 * r["context"] / 64, "device": "H100 80GB", "dtype": "bfloat16"}
           for r in (rows[0], longer[0])]
    mem = "\n".join(memory_vs_context(rows + longer + gpu, tmp_path))
    assert "pending" not in mem and "100k params, train_step bfloat16, batch=1 (compiled for H100 80GB): from T 64 to 128" in mem

    float32 = _bench_run("before_after_float32", 5, [{"params": 1, "context": 64, "batch": 16, "step_ms": 100.0,
                                                      "step_ms_std": 1.0, "tokens_per_s": 10240.0, "memory_gb": 1.0}])
    remat = _bench_run("before_after_remat", 5, [{**float32["bench_rows"][0], "step_ms": 130.0, "tokens_per_s": 7877.0,
                                                   "memory_gb": 0.5}])
    close = _bench_run("before_after_bfloat16", 5, [{**float32["bench_rows"][0], "step_ms": 100.5, "tokens_per_s": 10189.0}])
    lines = before_after([float32, remat, close], tmp_path)
    assert "- remat: tokens/s -23% (beyond noise), peak memory (GB) -50% (no interval), step time (ms) +30% (beyond noise)" in lines
    assert "- bfloat16: tokens/s -0% (within noise), peak memory (GB) +0% (no interval), step time (ms) +0% (within noise)" in lines
    assert (tmp_path / "before_after.png").is_file()


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


def test_tokenizer_study_fits_and_tables_by_hand(tmp_path):
    """BPE training rows made to follow the fitted laws exactly: 0.5 s per MB pre-tokenising, distinct pre-tokens
    1000 x (bytes / 1e6)^0.5, 1 ms of merging per distinct pre-token, 10 MB + 1000 B per distinct pre-token."""
    from experiments.report.tokenizer import tokenizer

    runs = []
    for i, mb in enumerate((1, 2, 4)):
        d = tmp_path / f"bpe{i}"
        d.mkdir()
        words = 1000 * mb ** 0.5
        (d / "tokenizer.json").write_text(json.dumps({
            "kind": "train", "bytes": mb * 1e6, "vocab_size": 10000, "distinct_pretokens": words, "pretokenize_s": 0.5 * mb,
            "merge_s": words / 1000, "total_s": 0.5 * mb + words / 1000, "longest_token": " notwithstanding",
            "longest_token_bytes": 16, "profile_top": [{"function": "bpe.py:301(_merge)", "own_s": 1.0}], "profiled_total_s": 2.0}))
        runs.append({"name": f"bpe{i}", "_dir": str(d), "status": "ok", "max_rss_bytes": 10e6 + 1000 * words})
    d = tmp_path / "speed"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps({"kind": "throughput", "text": "t.txt", "rows": [
        {"tokenizer": "ours", "bytes_per_s": [1e6, 1.1e6, 0.9e6]}]}))
    runs.append({"name": "speed", "_dir": str(d), "status": "ok"})
    text = "\n".join(tokenizer(runs)[1])
    assert ("pre-tokenisation 0.5 s per MB; distinct pre-tokens 1 x bytes^0.500 (Heaps' law); merging 1 ms per distinct "
            "pre-token at vocabulary 10000; peak memory 9.54 MiB + 1e+03 B per distinct pre-token") in text
    # TinyStories, 2.2 GB: sqrt(2200) x 1000 = 46,904 words; 0.5 x 2200 + 46.9 = 1146.9 s = 0.32 h; 10 MB + 46.9 MB
    assert "TinyStories V2 train (2.2 GB, vocabulary 10000): about 46,904 distinct pre-tokens, 0.32 hours" in text
    assert "peak memory about 54.3 MiB" in text
    # 1.0 MB/s mean, sd 0.1 over 3: 4.303 x 0.1 / sqrt(3) = 0.25; 825 GB / 1 MB/s = 229 h
    assert "| ours | 1.00 ± 0.25 | 3 | 229 h (9.5 days) |" in text


def test_tokenizer_study_trains_on_the_data_root(tmp_path, monkeypatch):
    from deliverables import tokenizer_study

    root = tmp_path / "root"
    for src in tokenizer_study.LARGEST:
        (root / src).parent.mkdir(parents=True, exist_ok=True)
        (root / src).write_text("ab ab ab ab\n")
    monkeypatch.setenv("JAXLM_DATA", str(root))
    (tmp_path / "run").mkdir()
    out = tokenizer_study.train(tmp_path / "run", 1.0, 300)
    # pre-tokens "ab" x3, " ab" x9, "\n" x3: merge (a, b) (12), then (" ", ab) (9), then no pair is left
    assert (out["distinct_pretokens"], out["merges"], out["longest_token"], out["longest_token_bytes"]) == (3, 2, " ab", 3)
    assert out["bytes"] == 3 * 12 + 2 * len("<|endoftext|>") and not (tmp_path / "run" / "text.txt").exists()
