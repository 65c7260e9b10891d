"""experiments.report.backend: CPU evidence sentences, the memory labels, and the H100 estimate beside CPU rows."""

from experiments.report import backend

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


def test_estimate_table_labels_measured_figures_and_the_h100_estimate():
    run_b = {"name": "bench", "kind": "bench", "device": "cpu", "status": "ok",
             "spec": {"set": {"model.d_model": 64, "model.num_layers": 2, "model.num_heads": 4, "model.vocab_size": 257}, "args": {}}}
    run_t = {"name": "train", "kind": "train", "device": "cpu", "status": "ok", "max_rss_bytes": 6e8,
             "config": {"model": {"d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 257, "context_length": 64},
                        "compute": {"dtype": "float32", "attention": "xla", "remat": "none"}, "data": {"batch_size": 16}}}
    rows = [dict(ROW, dtype="float32", remat="none", memory_gb=0.01)]
    text = backend.estimate_table([run_b, run_t], rows)
    assert "**estimate**" in text and "(compiled estimate)" in text and "(peak host RSS)" in text
    assert "`bench` train_step float32 xla remat=none" in text and "`train`" in text
    assert backend.section([{**run_t, "device": "gpu"}], []) == []
