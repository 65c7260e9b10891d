"""deliverables.report on one training run (learning curves + a 256-token sample) and --all over every plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deliverables.report import __main__ as report
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
    from deliverables.report.run_page import fluency
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


def test_wall_time_counts_the_invocations_not_the_gap_between_them():
    """Two invocations 35 minutes apart: 10 s + 20 s of wall time, by hand; the resumed one's config change listed."""
    rows = [{"step": 0, "kind": "start", "time": 100.0}, {"step": 5, "kind": "train", "time": 104.0},
            {"step": 10, "kind": "train", "time": 110.0},
            {"step": 10, "kind": "start", "time": 2210.0, "changed": {"optim.lr": [0.002, 0.003]}},
            {"step": 20, "kind": "train", "time": 2230.0}]
    out = summarise_train(rows)
    assert out["logged_time_s"] == pytest.approx(30.0)
    assert out["config_changes"] == [(10, {"optim.lr": [0.002, 0.003]})]
    assert summarise_train([r for r in rows if r["kind"] != "start"])["logged_time_s"] == 2230.0 - 104.0


def test_fluency_measures_repetition():
    from deliverables.report.run_page import fluency

    lines = fluency([1, 2] * 10, "a b c d " * 5)
    assert lines[0].startswith("11% of its 19 token bigrams") and "occurs 5 times" in lines[1]


def test_single_run_options_are_checked(tiny_run, capsys):
    assert cli.run(report.main, [str(tiny_run), "--tokens", "10"]) == 2
    assert "--tokens" in capsys.readouterr().err


# --------------------------------------------------------------------------- charts


def test_before_after_prefers_the_bench_rows_and_falls_back_to_training_runs():
    from deliverables.report.charts import before_after_bars

    def bench(tech, tps, mem):
        return {"name": f"before_after_{tech}", "plan": "optimizations", "status": "ok", "kind": "bench",
                "axes": {"technique": tech},
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
    # t(0.975, 1) = 12.706
    assert bars["float32"]["tokens_per_s"].ci == pytest.approx(12.706 * 141.42 / 2 ** 0.5, rel=1e-3)
    runs += [bench("float32", 1000.0, 8.0), bench("bfloat16", 2500.0, 5.0)]
    assert means(before_after_bars(runs)) == {"float32": {"tokens_per_s": 1000.0, "memory_gb": 8.0, "step_ms": 100.0},
                                              "bfloat16": {"tokens_per_s": 2500.0, "memory_gb": 5.0, "step_ms": 100.0}}


def _bench_run(name, steps, rows):
    return {"name": name, "plan": "optimizations", "status": "ok", "kind": "bench", "spec": {"args": {"steps": steps}},
            "bench_rows": [{"status": "ok", "framework": "jax", "mode": "train_step", "dtype": "float32",
                            "attention": "xla", "remat": "none", "device": "cpu", **r} for r in rows]}


def test_chart_lines_keep_studies_models_and_settings_apart():
    from deliverables.report.charts import BEFORE_AFTER, before_after_bars, bench_rows, judged_bars, lines_by

    # Two models (100k and 400k parameters) at batch 1 and 2, context 64; 5 timed steps, step-time std 2 ms (n-divided)
    small = [{"params": 100_000, "context": 64, "batch": b, "step_ms": 10.0 * b, "step_ms_std": 2.0,
              "tokens_per_s": 6400.0, "memory_gb": 0.1 * b} for b in (1, 2)]
    big = [{**r, "params": 400_000, "step_ms": 40.0 * r["batch"], "tokens_per_s": 1600.0} for r in small]
    rows = bench_rows([_bench_run("sweep", 5, small + big)])
    tok = lambda r: (r["tokens_per_s"], 0.0, "CPU")  # noqa: E731
    lines = lines_by(rows, "batch", "context", tok)
    assert sorted(lines) == ["optimizations: 100k params, train_step float32, context=64 (CPU)",
                             "optimizations: 400k params, train_step float32, context=64 (CPU)"]
    # a run that set compute.loss_chunk is another setting, and another study's row at batch 4 another line
    chunked = _bench_run("maxbatch_chunked", 5, [{**small[0], "batch": 3, "tokens_per_s": 9000.0}])
    chunked["spec"]["set"] = {"compute.loss_chunk": 1024, "model.d_model": 8}
    other = {**_bench_run("b4", 5, [{**small[0], "batch": 4}, {**small[0], "batch": 8}]), "plan": "profiling"}
    lines = lines_by(rows + bench_rows([chunked, other]), "batch", "context", tok)
    assert [x for x, _, _ in lines["optimizations: 100k params, train_step float32, context=64 (CPU)"]] == [1, 2]
    assert [x for x, _, _ in lines["profiling: 100k params, train_step float32, context=64 (CPU)"]] == [4, 8]
    # another run of the same study measuring batch 2 again: each run its own line, never one averaged point
    again = _bench_run("again", 5, [{**small[1], "tokens_per_s": 3200.0}, {**small[1], "batch": 16}])
    lines = lines_by(rows + bench_rows([again]), "batch", "context", tok)
    assert lines["optimizations: 100k params, train_step float32, context=64 (CPU), run sweep"] == [
        (1, 6400.0, 0.0), (2, 6400.0, 0.0)]
    assert [x for x, _, _ in lines["optimizations: 100k params, train_step float32, context=64 (CPU), run again"]] == [
        2, 16]
    # 95 % half-width of a 10 ms step: 2.776 x (2 x sqrt(5/4)) / sqrt(5) = 2.776 ms
    assert rows[0]["step_ms_ci95"] == pytest.approx(2.776, abs=1e-3)

    float32 = _bench_run("before_after_float32", 5, [{"params": 1, "context": 64, "batch": 16, "step_ms": 100.0,
                                                      "step_ms_std": 1.0, "tokens_per_s": 10240.0, "memory_gb": 1.0}])
    remat = _bench_run("before_after_remat", 5, [{**float32["bench_rows"][0], "step_ms": 130.0, "tokens_per_s": 7877.0,
                                                   "memory_gb": 0.5}])
    close = _bench_run("before_after_bfloat16", 5, [{**float32["bench_rows"][0], "step_ms": 100.5,
                                                     "tokens_per_s": 10189.0}])
    bars = before_after_bars([float32, remat, close])
    verdicts, _ = judged_bars(bars, ["float32", "remat", "bfloat16"], list(BEFORE_AFTER))
    assert verdicts == {("remat", "tokens_per_s"): True, ("remat", "memory_gb"): None, ("remat", "step_ms"): True,
                        ("bfloat16", "tokens_per_s"): False, ("bfloat16", "memory_gb"): None,
                        ("bfloat16", "step_ms"): False}


def test_tokenizer_study_fits_and_tables_by_hand(tmp_path):
    """BPE training rows made to follow the fitted laws exactly: 0.5 s per MB pre-tokenising, distinct pre-tokens
    1000 x (bytes / 1e6)^0.5, 1 ms of merging per distinct pre-token, 10 MB + 1000 B per distinct pre-token."""
    from deliverables.report.sections.tokenizer import tokenizer

    runs = []
    for i, mb in enumerate((1, 2, 4)):
        d = tmp_path / f"bpe{i}"
        d.mkdir()
        words = 1000 * mb ** 0.5
        (d / "tokenizer.json").write_text(json.dumps({
            "kind": "train", "bytes": mb * 1e6, "vocab_size": 10000, "distinct_pretokens": words,
            "pretokenize_s": 0.5 * mb,
            "merge_s": words / 1000, "total_s": 0.5 * mb + words / 1000, "longest_token": " notwithstanding",
            "longest_token_bytes": 16, "profile_top": [{"function": "bpe.py:301(_merge)", "own_s": 1.0}],
            "profiled_total_s": 2.0}))
        runs.append({"name": f"bpe{i}", "_dir": str(d), "status": "ok", "max_rss_bytes": 10e6 + 1000 * words})
    d = tmp_path / "speed"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps({"kind": "throughput", "text": "t.txt", "rows": [
        {"tokenizer": "ours", "bytes_per_s": [1e6, 1.1e6, 0.9e6]}]}))
    runs.append({"name": "speed", "_dir": str(d), "status": "ok"})
    text = "\n".join(tokenizer(runs)[1])
    assert ("pre-tokenisation 0.5 s per MB; distinct pre-tokens 1 x bytes^0.500 (Heaps' law); merging 1 ms per "
            "distinct pre-token at vocabulary 10000; peak memory 9.54 MiB + 1e+03 B per distinct pre-token") in text
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
    got = (out["distinct_pretokens"], out["merges"], out["longest_token"], out["longest_token_bytes"])
    assert got == (3, 2, " ab", 3)
    assert out["bytes"] == 3 * 12 + 2 * len("<|endoftext|>") and not (tmp_path / "run" / "text.txt").exists()
