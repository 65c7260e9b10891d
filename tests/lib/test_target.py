"""Compiling training's step for a GPU on a machine without one (jaxlm.predict, the gpu-compile extra),
the device table it compiles for (jaxlm.analysis.devices) and the largest-batch search (jaxlm.analysis.memory)."""

import dataclasses
import json
import math

import pytest

from jaxlm.analysis import devices, flops
from jaxlm.analysis.memory import compiled_memory, search_largest
from jaxlm.core import platform
from jaxlm.core.config import load_config
from jaxlm.core.errors import DataError, MissingExtra, UsageError
from jaxlm.predict import compile as gpu
from jaxlm.predict import store as compile_cache
from jaxlm.predict import target
from jaxlm.predict.program import program_facts
from tests.lib import gpu_programs as programs
from tests.lib.gpu_programs import needs_programs
from tests.train_helpers import needs_compiler

HLO = """\
%gemm_fusion_dot.1_computation (parameter_0: bf16[512,128], parameter_1: bf16[128,384]) -> bf16[512,384] {
  %parameter_0 = bf16[512,128]{1,0} parameter(0)
  %parameter_1 = bf16[128,384]{1,0} parameter(1)
  ROOT %dot.1 = bf16[512,384]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_computation (parameter_0: f32[8,64], parameter_1: f32[64,64]) -> f32[8,64] {
  %parameter_0 = f32[8,64]{1,0} parameter(0)
  %parameter_1 = f32[64,64]{1,0} parameter(1)
  ROOT %dot.2 = f32[8,64]{1,0} dot(%parameter_0, %parameter_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (p0: bf16[4,128,2,64], p1: bf16[64,64], p2: bf16[64,64]) -> f32[] {
  %p0 = bf16[4,128,2,64]{3,2,1,0} parameter(0)
  %p1 = bf16[64,64]{1,0} parameter(1)
  %p2 = bf16[64,64]{1,0} parameter(2)
  %c = (bf16[64,64]{1,0}, s8[1024]{0}) custom-call(%p1, %p2), custom_call_target="__cublas$gemm"
  %f = (bf16[4,2,128,64]{3,2,1,0}, f32[4,2,128]{2,1,0}) custom-call(%p0, %p0, %p0), \
custom_call_target="__cudnn$fmhaSoftmax"
  %b = (bf16[4,2,128,64]{3,2,1,0}) custom-call(%p0, %p0), custom_call_target="__cudnn$fmhaSoftmaxBackward"
  %p1.remat2 = bf16[64,64]{1,0} copy(%p1)
}
"""


def test_program_facts_count_matmuls_by_operand_dtype_and_cudnn_calls():
    facts = program_facts(HLO)
    assert facts["matmul_dtypes"] == {"bf16xbf16": 2, "f32xf32": 1}  # two dots in fusions and one cuBLAS call
    assert facts["matmuls"] == 3
    assert facts["cudnn_calls"] == {"fmhaSoftmax": 1, "fmhaSoftmaxBackward": 1}
    assert facts["rematerialised"] == 1  # %p1.remat2: a clone XLA's rematerialisation pass made


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 7, 8, 9, 31, 100, 1000])
@pytest.mark.parametrize("guess", [1, 2, 5, 9, 64, 2000])
def test_search_largest_finds_the_threshold_from_any_guess(threshold, guess):
    calls = []

    def fits(k):
        calls.append(k)
        return k <= threshold

    assert search_largest(fits, 1000, guess) == min(threshold, 1000)
    assert len(calls) <= 2 * math.ceil(math.log2(1000)) + 3 and 1001 not in calls and 0 not in calls


def test_the_device_table_names_devices_by_whole_words_most_specific_first():
    assert devices.find("NVIDIA H100 80GB HBM3").name == "h100-80gb"
    assert devices.find("NVIDIA H100 NVL").name == "h100-94gb"  # not the SXM part's peak
    assert devices.find("NVIDIA L40S") is None and devices.find("cpu") is None  # "L4" is not a word of it
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16") == 312e12
    assert flops.peak_flops("Tesla V100-SXM2-32GB", "bfloat16") is None  # Volta has no bfloat16 tensor cores
    for name in devices.TARGETS:  # what is compiled for is what is estimated for
        t = target.parse_target(name)
        d = devices.DEVICES[name]
        assert (t.memory_bytes, t.description) == (d.memory_bytes, d.description)


def test_the_compiled_memory_reader_counts_aliased_bytes_once():
    class Analysis:  # what memory_analysis() returns, in bytes
        argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes = 100, 90, 80, 7

    class Compiled:
        def memory_analysis(self):
            return Analysis()

    m = compiled_memory(Compiled())
    assert (m.argument, m.output, m.alias, m.temp, m.total) == (100, 90, 80, 7, 100 + 90 + 7 - 80)
    assert compiled_memory(Analysis()) == m and compiled_memory(type("NoAnalysis", (), {
        "memory_analysis": lambda self: None})()) is None


def test_targets_parse_with_a_count_and_unknown_names_are_one_line():
    t = target.parse_target("h100-80gb:8")
    assert (t.name, t.count, t.description, t.memory_bytes) == ("h100-80gb", 8, "NVIDIA H100 80GB HBM3", 84_942_979_072)
    assert "cuda_compute_capability { major: 9 minor: 0 }" in t.config and "core_count: 132" in t.config
    with pytest.raises(UsageError, match="--target h900: unknown GPU; known: h100-80gb"):
        target.parse_target("h900")
    with pytest.raises(UsageError, match="positive integer"):
        target.parse_target("h100-80gb:0")


def test_a_target_config_file_is_read_and_checked(tmp_path):
    f = tmp_path / "mygpu.txtpb"
    f.write_text(devices.DEVICES["l4"].config_text())
    t = target.parse_target(None, f"{f}:2")
    assert (t.name, t.count, t.description, t.memory_bytes) == ("mygpu", 2, "NVIDIA L4", 23_034 * 2**20)
    (tmp_path / "bad.txtpb").write_text("platform_name: \"CUDA\"\n")
    with pytest.raises(DataError, match="bad.txtpb: no device_memory_size"):
        target.parse_target(None, tmp_path / "bad.txtpb")


# A GPU the device table lacks, as a .toml --target-config file: compiler fields and rates (datasheet figures of
# an A100 SXM's size at an L4's bandwidth, an invented GPU).
GPU_TOML = """description = "Invented GPU"
memory_bytes = 25769803776
bandwidth = 900.0e9
peak_bfloat16 = 200e12
peak_tf32 = 100e12
peak_float32 = 20e12
sms = 80
compute_capability = [8, 0]
clock_ghz = 1.5
l2_bytes = 41943040
shared_per_sm = 167936
shared_per_block_optin = 166912
threads_per_sm = 2048
host_link = 32e9
"""


def test_a_toml_target_config_carries_the_rates_its_kernels_are_priced_at(tmp_path):
    from jaxlm.predict import roofline

    f = tmp_path / "invented.toml"
    f.write_text(GPU_TOML)
    t = target.parse_target(None, f"{f}:2")
    assert (t.name, t.count, t.description, t.memory_bytes) == ("invented", 2, "Invented GPU", 25769803776)
    assert "core_count: 80" in t.config and "cuda_compute_capability { major: 8 minor: 0 }" in t.config
    rates = roofline.device_rates(t.device)
    assert (rates.sms, rates.host_bandwidth) == (80, pytest.approx(32e9 * 3.0e12 / 3.35232e12))
    assert rates.matmul_flops["bf16"] == pytest.approx(200e12 * 798e12 / 989e12 * 2112 / 2048)  # the H100's rule
    f.write_text(GPU_TOML.replace("peak_bfloat16 = 200e12\n", ""))
    with pytest.raises(DataError, match=r"--target-config .*invented.toml: no peak_bfloat16; a .toml GPU gives"):
        target.parse_target(None, f)
    f.write_text(GPU_TOML.replace("sms = 80", "sms = \"many\""))
    with pytest.raises(DataError, match=r"invented.toml: sms = 'many': expected int"):
        target.parse_target(None, f)


@needs_compiler
@pytest.mark.parametrize("gpu", ["--target rtx5090", "--target b200", "--target-config FILE"])
def test_bench_model_predicts_for_new_rows_and_for_a_gpu_given_with_its_rates(gpu, tmp_path, capsys):
    from jaxlm.bench.commands import main

    (tmp_path / "invented.toml").write_text(GPU_TOML)
    flag, name = gpu.replace("FILE", str(tmp_path / "invented.toml")).split()
    out = tmp_path / "rows.json"
    sets = [x for s in TINY for x in ("--set", s)]
    assert main(["model", flag, name, *sets, "--context", "64", "--batch", "4", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    described = {"rtx5090": "NVIDIA GeForce RTX 5090", "b200": "NVIDIA B200"}.get(name, "Invented GPU")
    assert row["status"] == "ok" and row["predicted_step_ms"] > 0 and 0 < row["predicted_mfu"] < 1
    assert row["predicted_label"] == f"predicted from the compiled program for {described}, not measured"
    assert row["dtype_label"] == "float32 (TF32 matmuls)" and "total GiB" in capsys.readouterr().out


def test_without_the_extra_target_stops_naming_it(monkeypatch):
    monkeypatch.setattr(platform, "cuda_plugin_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"'gpu-compile' extra: pip install -e '\.\[gpu-compile\]'"):
        target.require_compiler()


TINY = ["model.num_layers=2", "model.d_model=64", "model.num_heads=2", "model.d_ff=128", "model.vocab_size=256",
        "model.context_length=64", "data.batch_size=4"]


@pytest.fixture(scope="module")
def compiled():
    """Rows of the shared programs (tests/lib/gpu_programs.py) for one H100: float32 without and with remat full,
    bfloat16, bfloat16 + cuDNN."""
    t = target.parse_target("h100-80gb")
    out = {}
    for name in ("f32", "f32_full", "bf16", "cudnn"):
        cfg, program = programs.program(name)
        out[name] = gpu.describe(program, t, cfg=cfg)
    out["cfg"] = cfg
    return out


@needs_programs
def test_compiled_matmuls_run_in_the_compute_dtype(compiled):
    assert set(compiled["f32"]["matmul_dtypes"]) == {"f32xf32"}
    assert set(compiled["cudnn"]["matmul_dtypes"]) == {"bf16xbf16"}
    bf16 = compiled["bf16"]["matmul_dtypes"]
    assert bf16["bf16xbf16"] > 3 * bf16.get("f32xf32", 0)  # only the XLA attention's score gradients stay float32


@needs_programs
def test_remat_full_lowers_temp_bytes_by_recomputing(compiled):
    assert compiled["f32_full"]["temp_bytes"] < 0.8 * compiled["f32"]["temp_bytes"]
    assert compiled["f32_full"]["matmuls"] > compiled["f32"]["matmuls"]  # the forward, again in the backward


@needs_programs
def test_cudnn_attention_becomes_cudnn_calls(compiled):
    layers = compiled["cfg"].model.num_layers
    assert compiled["cudnn"]["cudnn_attention_calls"] >= 2 * layers  # forward and backward of each layer
    assert compiled["bf16"]["cudnn_attention_calls"] == 0
    assert "H100" in compiled["cudnn"]["label"] and "not measured" in compiled["cudnn"]["label"]


@needs_programs
def test_the_arguments_are_the_donated_state_and_the_batch(compiled):
    """argument bytes = the train state's bytes (float32 parameters and AdamW moments, step, RNG) + 2 batches
    of int32 tokens, counted from the abstract state; the state comes back aliased to its donated input."""
    import jax

    from jaxlm.core import sharding
    from jaxlm.training.loop import build

    cfg = compiled["cfg"]
    gpus = target.devices(target.parse_target("h100-80gb"))
    built = build(cfg, sharding.make_mesh(devices=list(gpus), cfg=cfg.parallel))
    state = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(built.abstract))
    row = compiled["cudnn"]
    assert row["argument_bytes"] == state + 2 * programs.BATCH * programs.CONTEXT * 4
    assert state - 16 <= row["alias_bytes"] <= state
    assert row["total_bytes"] == row["argument_bytes"] + row["output_bytes"] + row["temp_bytes"] - row["alias_bytes"]
    assert row["fits"] and row["usable_bytes"] == int(0.75 * 84_942_979_072)


@needs_compiler
def test_the_cudnn_guard_asks_the_target_not_the_machine():
    cfg = load_config(None, [*TINY, 'compute.dtype="bfloat16"', 'compute.attention="cudnn"'])
    older = dataclasses.replace(target.parse_target("h100-80gb"), name="old",
                                config=devices.DEVICES["h100-80gb"].config_text().replace("major: 9", "major: 7"))
    with pytest.raises(Exception, match="compute capability \\(7, 0\\)"):
        gpu.compile_step(cfg, older)


@needs_programs
def test_the_compile_cache_reuses_a_figure_of_the_same_lowered_program(tmp_path, monkeypatch):
    """A job spelled another way (a default written out) lowers to the same program: its figures come back as
    stored, without a compile; a different program (float32) is compiled."""
    monkeypatch.setattr(gpu, "compile_step", programs.compile_step)  # the programs of `compiled`, compiled once
    t, cache = target.parse_target("h100-80gb"), tmp_path / "h100.json"
    shape = [f"model.context_length={programs.CONTEXT}", f"data.batch_size={programs.BATCH}"]
    job = {"preset": None, "set": [*programs.MODEL, *shape, 'compute.dtype="bfloat16"'], "mode": "train_step"}
    first = compile_cache.CompileCache(cache).row(job, t)
    compiles = []
    real = gpu.compiled_row
    monkeypatch.setattr(gpu, "compiled_row", lambda *a, **k: compiles.append(a) or real(*a, **k))
    store = compile_cache.CompileCache(cache)
    assert store.row({**job, "set": [*job["set"], 'compute.remat="none"']}, t) == first and compiles == []
    other = store.row({**job, "set": [*job["set"], 'compute.dtype="float32"']}, t)
    assert len(compiles) == 1 and other["program"] != first["program"] and other["temp_bytes"] > first["temp_bytes"]
    assert len(compile_cache.CompileCache(cache).stored) == 3  # the first job in both spellings, the new one


@needs_compiler
def test_stored_compiled_figures_come_from_the_program_the_step_lowers_to_today():
    """The committed figures are keyed by job, not by jaxlm's sources: an edit that changes the program a
    stored job lowers to makes its figures stale, and this fails until they are compiled again
    (`python -m deliverables.compiled_memory --target h100-80gb`). The four smallest stored jobs are checked."""
    import json
    from pathlib import Path

    import jax

    t = target.parse_target("h100-80gb")
    stored = json.loads((Path(__file__).resolve().parents[2] / "docs/results/compiled/h100-80gb.json").read_text())
    jobs = [(json.loads(k)[0], v["program"]) for k, v in stored.items()
            if "program" in v and json.loads(k)[3] == jax.__version__]
    if not jobs:
        pytest.skip(f"no stored figure was compiled with jax {jax.__version__}")

    def size(job):
        cfg = compile_cache.job_config(job)
        return cfg.model.num_layers * cfg.model.d_model * cfg.model.context_length * cfg.data.batch_size

    for job, program in sorted(jobs, key=lambda j: size(j[0]))[:4]:
        lowered = gpu.lower_step(compile_cache.job_config(job), t, job.get("mode", "train_step"))
        assert gpu.program_hash(lowered, t) == program, job
