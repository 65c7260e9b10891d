"""deliverables.report.sections.backend: CPU evidence sentences, the memory labels, and the H100 estimate beside
CPU rows."""


from deliverables.report.sections import backend
from tests.train_helpers import needs

needs_compiler = needs("gpu-compile")

ROW = dict(framework="jax", mode="train_step", attention="xla", context=64, batch=4, status="ok", device="cpu",
           memory_source="memory_analysis", run="bench")


def test_evidence_from_the_recorded_compiled_steps():
    rows = [dict(ROW, dtype="float32", remat="none", hlo_dots=57, xla_flops=1e9, estimate_gb=0.5, memory_gb=0.5),
            dict(ROW, dtype="float32", remat="full", hlo_dots=73, xla_flops=1.2e9, estimate_gb=0.49, memory_gb=0.49),
            dict(ROW, dtype="bfloat16", remat="none", hlo_dots=57, matmul_dtypes=["f32"], memory_gb=0.5)]
    text = " ".join(backend.evidence(rows))
    assert "73 matmuls" in text and "against 57" in text and "keeps the recomputation" in text
    assert "produce f32" in text and "through float32" in text
    old = [{k: v for k, v in r.items() if k not in ("hlo_dots", "matmul_dtypes")} for r in rows]
    assert "predate" in backend.evidence(old)[0]


def test_annotate_marks_technique_memory_sentences_on_cpu_only():
    s = ["bfloat16 against float32 at data.batch_size=32: raised peak host memory (RSS) by 4%",
         "train_step: remat=full against remat=none (1 row pair): cut compiled memory estimate by 1%",
         "window16 against float32: cut validation perplexity by 4%"]
    out = backend.annotate(s, cpu=True)
    assert out[0].endswith(f"(see *{backend.SECTION}*).") and out[1].endswith(f"(see *{backend.SECTION}*).")
    assert out[2] == s[2]
    assert backend.annotate(s, cpu=False) == s


def _runs(n_train: int = 3):
    run_b = {"name": "bench", "kind": "bench", "device": "cpu", "status": "ok",
             "spec": {"set": {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4,
                              "model.vocab_size": 257}, "args": {}}}
    config = {"model": {"d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 257, "context_length": 64},
              "compute": {"dtype": "float32", "attention": "xla", "remat": "none"}, "data": {"batch_size": 16}}
    train = [{"name": f"train{i}", "kind": "train", "device": "cpu", "status": "ok", "max_rss_bytes": 6e8 + i * 2**20,
              "config": config} for i in range(n_train)]
    other = {**train[0], "name": "wide", "config": {**config, "model": {**config["model"], "d_model": 128}}}
    return [run_b, *train, other], [dict(ROW, dtype="float32", remat="none", memory_gb=0.01)]


def test_gpu_table_groups_equal_steps_and_labels_every_figure(tmp_path):
    """Without a compiled figure (an empty cache, no --compile), the compiled cells say so; the estimate is
    jaxlm.memory's for that very step; the three identical training steps share one row."""
    from jaxlm.analysis import memory
    from jaxlm.core.config import ComputeConfig, ModelConfig

    runs, rows = _runs()
    text = backend.gpu_table(runs, rows, cache=tmp_path / "h100.json")
    assert "**not a measurement**" in text and "not compiled here" in text and not (tmp_path / "h100.json").exists()
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(lines) == 3  # the bench step, the three training runs, the wide model
    assert lines[0].startswith("| `bench` train_step float32 xla remat=none | 64 | 4 |")
    assert "(compiled estimate)" in lines[0]
    trained = "| `train0`, `train1`, `train2` | 64 | 16 | 572 MiB to 574 MiB (peak host RSS) | - | - |"
    assert lines[1].startswith(trained)
    model = ModelConfig(d_model=64, num_layers=2, num_heads=4, vocab_size=257, context_length=64)
    est = memory.estimate(model, 16, 64, ComputeConfig(), "train_step").total
    assert f"| {backend.fmt(est, 'bytes')} |" in lines[1]
    assert backend.section([{**runs[1], "device": "gpu"}], []) == []


@needs_compiler
def test_gpu_table_compiles_each_step_once_for_the_h100(tmp_path):
    """With --compile: one compile per distinct step, kept in the cache; the compiled total holds at least the
    float32 parameters and both AdamW moments (12 bytes a parameter) and fits the H100."""
    import json

    from jaxlm.analysis.flops import param_counts
    from jaxlm.core.config import ModelConfig

    runs, _ = _runs(2)
    text = backend.gpu_table(runs[1:3], [], compile=True, cache=tmp_path / "h100.json")
    stored = list(json.loads((tmp_path / "h100.json").read_text()).values())
    assert len(stored) == 1
    model = ModelConfig(d_model=64, num_layers=2, num_heads=4, vocab_size=257, context_length=64)
    params = param_counts(model)["total"]
    assert stored[0]["total_bytes"] >= 12 * params
    row = next(line for line in text.splitlines() if line.startswith("| `train0`"))
    assert f"| {backend.fmt(stored[0]['total_bytes'], 'bytes')} | yes |" in row and "not compiled here" not in text
