"""Predicted GPU time where it shows: the device table's achieved rates, the passes and model parts of a
prediction, compiled rows' predicted_* keys (jaxlm.bench model --target), `ops --target` and the compiled store."""

import json
from pathlib import Path

import pytest

from jaxlm.analysis.devices import DEVICES, KERNEL_LAUNCH_S
from jaxlm.predict import calibration
from jaxlm.predict import compile as gpu
from jaxlm.predict import roofline as rl
from jaxlm.predict import store as compile_cache
from jaxlm.predict.target import parse_target
from tests.lib import gpu_programs as programs
from tests.lib.gpu_programs import needs_programs
from tests.train_helpers import needs_compiler

FRAMES = (Path(__file__).parent / "hlo" / "source_frames.hlo").read_text()


def test_achieved_rates_are_the_measured_figures_where_measured_and_the_h100_share_elsewhere():
    h100 = rl.device_rates(DEVICES["h100-80gb"])
    # the 8192^3 bf16 matmul measured on the H100 ran 2048 tiles of 256 x 128 in 16 waves of 132 SMs: a wave
    # that fills the SMs runs 2112 / 2048 faster, the full-wave rate GEMMs are priced at
    wave = 2048 / (16 * 132)
    share = 798e12 / 989e12 / wave
    assert h100.matmul_flops == pytest.approx({"bf16": share * 989e12, "tf32": share * 494.5e12, "fp32": share * 67e12})
    copy = 3.0e12 / 3.35232e12  # the measured copy over the datasheet bandwidth
    assert (h100.memory_bandwidth, h100.launch_seconds) == (3.0e12, KERNEL_LAUNCH_S.value)
    assert h100.link_bandwidth == pytest.approx(copy * 450e9)  # NVLink 4: 900 GB/s both ways
    assert h100.host_bandwidth == pytest.approx(copy * 64e9)  # PCIe 5.0 x16: 128 GB/s both ways
    assert (h100.sms, h100.exp_rate) == (132, pytest.approx(16 * 132 * 1.98e9))
    h200 = rl.device_rates(DEVICES["h200"])
    assert (h200.matmul_flops["bf16"], h200.memory_bandwidth) == (pytest.approx(784e12 / wave), 4.3e12)
    a100 = rl.device_rates(DEVICES["a100-80gb"])  # never measured: the H100's full-wave share of its own datasheet peak
    assert a100.matmul_flops["bf16"] == pytest.approx(share * 312e12)
    assert a100.memory_bandwidth == pytest.approx(copy * 2.03904e12)
    assert rl.device_rates(DEVICES["tpu-v4"]).link_bandwidth is None


def _passes(text: str) -> str:
    """FRAMES with jax op names that say which pass each kernel is in."""
    for name, op in (("a", "jvp(BNTH,BNSH->BNTS)/dot_general"), ("b", "transpose(jvp())/exp"),
                     ("g", "transpose(jvp(jvp()))/checkpoint/rematted_computation/ki,oi->ko/dot_general")):
        text = text.replace(f'op_name="{name}"', f'op_name="jit(train_step)/{op}"')
    return text


def test_kernels_know_their_pass_and_part_of_the_model():
    p = rl.predict(_passes(FRAMES), rl.device_rates(DEVICES["h100-80gb"]))
    k = {x.name: x for x in p.kernels}
    assert {n: x.phase for n, x in k.items()} == {
        "scores": "forward", "softmax": "backward", "adam": "optimizer", "norm": "forward", "act": "forward",
        "move": "other", "proj": "recompute"}
    assert {n: x.component for n, x in k.items()} == {
        "scores": "attention matmuls", "softmax": "attention softmax and mask", "adam": "optimizer and clipping",
        "norm": "norms", "act": "other", "move": "optimizer and clipping", "proj": "norms"}
    for by in ("phase", "component", "group"):
        assert sum(p.split(by).values()) == pytest.approx(p.seconds)
    assert p.dtype_class == "tf32"  # float32 dots at JAX's default precision
    s = rl.summary(p, top=3)
    assert [g["group"] for g in s["groups"]] == list(rl.GROUPS) and len(s["top"]) == 3
    assert sum(g["share"] for g in s["groups"]) == pytest.approx(1.0)
    assert s["predicted_ms"] == pytest.approx(1e3 * p.seconds)
    assert s["top"][0]["op"] == "jvp(BNTH,BNSH->BNTS)/dot_general"  # without the jit(...) every op starts with


def test_the_store_prices_a_figure_without_a_current_prediction_again_once(tmp_path, monkeypatch):
    """A figure stored before predictions existed, or priced by an older model, is reused as it is, compiled again
    when a prediction is asked for, and the new figure replaces every stored entry of the same program."""
    t, path = parse_target("h100-80gb"), tmp_path / "store.json"
    job = {"preset": None, "set": ["data.batch_size=2"], "mode": "train_step"}
    twin = {**job, "set": ["data.batch_size=2", 'compute.remat="none"']}
    older = {**job, "set": ["data.batch_size=4"]}
    old = {"total_bytes": 5, "program": "p"}
    stale = {"total_bytes": 7, "program": "q", "predicted_step_ms": 9.0, "predicted_label": "x",
             "predicted_pricing": rl.PRICING_VERSION - 1}
    path.write_text(json.dumps({compile_cache.CompileCache.key(j, t): f for j, f in ((job, old), (twin, old),
                                                                                   (older, stale))}))
    compiles = []
    new = {"total_bytes": 6, "temp_bytes": 1, "compile_s": 1.0, "predicted_step_ms": 2.5, "predicted_mfu": 0.3,
           "predicted_label": "y", "predicted_pricing": rl.PRICING_VERSION}
    monkeypatch.setattr(gpu, "lower_step", lambda cfg, *a: cfg.data.batch_size)
    monkeypatch.setattr(gpu, "program_hash", lambda lowered, t: "p" if lowered == 2 else "q")
    monkeypatch.setattr(gpu, "compiled_row", lambda *a, **k: compiles.append(a) or new)
    store = compile_cache.CompileCache(path)
    assert store.row(job, t) == old and store.row(older, t) == stale and compiles == []
    assert store.row(job, t, predicted=True)["predicted_step_ms"] == 2.5 and len(compiles) == 1
    stored = compile_cache.CompileCache(path)
    assert stored.row(twin, t, predicted=True) == {**new, "program": "p"}
    assert len(compiles) == 1
    assert stored.row(older, t, predicted=True)["predicted_step_ms"] == 2.5 and len(compiles) == 2


def test_a_step_without_rates_keeps_its_row_and_says_why():
    import dataclasses

    from jaxlm.core.config import load_config
    from jaxlm.predict import hlo

    loops = (Path(__file__).parent / "hlo" / "nested_loops.hlo").read_text()
    cfg, t = load_config(None, ["data.batch_size=2", "model.context_length=64"]), parse_target("h100-80gb")
    r = gpu.prediction(hlo.parse_module(loops), cfg, t)
    assert r["predicted_tokens_per_s"] == pytest.approx(2 * 64 / (r["predicted_step_ms"] / 1e3))
    assert r["predicted_peak"] == "bfloat16" and r["predicted_label"] == t.predicted_label
    mystery = dataclasses.replace(t, name="mystery", config=t.config.replace("NVIDIA H100 80GB HBM3", "Mystery X1"))
    unknown = gpu.prediction(hlo.parse_module(loops), cfg, mystery)
    assert unknown["predicted_step_ms"] is None and "Mystery X1" in unknown["predicted_label"]
    int8 = gpu.prediction(hlo.parse_module(loops.replace("bf16", "s8")), cfg, t)  # no int8 rate in the table
    assert int8["predicted_mfu"] is None and "no rate for dtype class 'int8'" in int8["predicted_label"]


class _Compiled:
    """What describe() reads of a compiled step: its memory plan (bytes) and its program."""

    def __init__(self, text: str, total: int):
        self.text, self.total = text, total

    def memory_analysis(self):
        return type("Analysis", (), {"argument_size_in_bytes": self.total, "output_size_in_bytes": 0,
                                     "alias_size_in_bytes": 0, "temp_size_in_bytes": 0})()

    def as_text(self) -> str:
        return self.text


def test_a_step_that_does_not_fit_has_no_time_and_says_so():
    from jaxlm.bench.kernels import format_kernels
    from jaxlm.core.config import load_config

    loops = (Path(__file__).parent / "hlo" / "nested_loops.hlo").read_text()
    cfg, t = load_config(None, ["data.batch_size=2", "model.context_length=64"]), parse_target("rtx4090")
    usable = 0.75 * t.memory_bytes
    fits = gpu.describe(_Compiled(loops, int(usable)), t, 0.75, cfg)
    assert fits["fits"] and fits["predicted_step_ms"] > 0
    r = gpu.describe(_Compiled(loops, 127 * 2**30), t, 0.75, cfg)
    assert not r["fits"] and (r["predicted_step_ms"], r["predicted_tokens_per_s"], r["predicted_mfu"]) == (None,) * 3
    assert r["predicted_label"] == f"does not fit (127.00 GiB of {int(usable) / 2**30:.2f} GiB usable)"
    table = {"label": r["predicted_label"], "mode": "train_step", "batch": 2, "context": 64,
             "dtype_label": r["dtype_label"], "attention": "xla", "remat": "none", "total_bytes": r["total_bytes"],
             "compile_s": 1.0, "predicted_step_ms": None}
    assert format_kernels(table).splitlines()[0] == r["predicted_label"]  # `ops --target`: no groups, no time


def test_float32_steps_say_their_matmuls_run_as_tf32_and_highest_as_fp32():
    from jaxlm.core.config import load_config
    from jaxlm.predict.program import program_facts

    f32 = (Path(__file__).parent / "hlo" / "nested_loops.hlo").read_text().replace("bf16", "f32")
    assert program_facts(f32)["matmul_precision"] == "TF32"  # JAX's default precision on an NVIDIA GPU
    highest = f32.replace("rhs_contracting_dims={0}", "rhs_contracting_dims={0}, operand_precision={highest,highest}")
    assert program_facts(highest)["matmul_precision"] == "FP32"
    cfg, t = load_config(None, ['compute.dtype="float32"']), parse_target("h100-80gb")
    r = gpu.describe(_Compiled(f32, 2**20), t, cfg=cfg)
    assert (r["dtype_label"], r["matmul_precision"], r["predicted_peak"]) == ("float32 (TF32 matmuls)", "TF32", "tf32")
    r = gpu.describe(_Compiled(highest, 2**20), t, cfg=cfg)
    assert (r["dtype_label"], r["predicted_peak"]) == ("float32 (FP32 matmuls)", "float32")
    assert gpu.dtype_label("bfloat16", "bfloat16") == "bfloat16"


@needs_compiler
def test_highest_precision_compiles_to_fp32_matmuls_priced_at_the_fp32_peak():
    """JAX_DEFAULT_MATMUL_PRECISION=highest (here its context manager) compiles float32 dots that keep every bit:
    they run on the CUDA cores, so the step is priced at float32's peak, not TF32's."""
    import jax

    from jaxlm.core.config import load_config

    cfg = load_config(None, [*programs.MODEL[:1], "model.d_model=64", "model.num_layers=1", "model.num_heads=2",
                             "model.d_ff=128", "model.context_length=64", "data.batch_size=2",
                             'compute.dtype="float32"'])
    t = parse_target("h100-80gb")
    default = gpu.compiled_row(cfg, t)
    with jax.default_matmul_precision("highest"):
        highest = gpu.compiled_row(cfg, t)
    assert (default["dtype_label"], default["predicted_peak"]) == ("float32 (TF32 matmuls)", "tf32")
    assert (highest["dtype_label"], highest["predicted_peak"]) == ("float32 (FP32 matmuls)", "float32")
    assert highest["predicted_step_ms"] > default["predicted_step_ms"]


# --------------------------------------------------------------------------- compiled for an H100



MODEL, CONTEXT, BATCH = programs.MODEL, programs.CONTEXT, programs.BATCH
SETTINGS = {"f32": ("float32", "xla", "none"), "bf16": ("bfloat16", "xla", "none"),
            "cudnn": ("bfloat16", "cudnn", "none"), "f32_full": ("float32", "xla", "full"),
            "cudnn_f32": ("float32", "cudnn", "none")}


@pytest.fixture(scope="module")
def rows():
    """`python -m jaxlm.bench model --target h100-80gb` rows of a small model in each setting (the programs of
    tests/lib/gpu_programs.py, compiled once)."""
    from jaxlm.bench.measure import BenchCase
    from jaxlm.core.config import load_config
    from jaxlm.predict.rows import bench_row

    cfg, t = load_config(None, MODEL), parse_target("h100-80gb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu, "compile_step", programs.compile_step)
        return {name: bench_row(BenchCase("jax", "train_step", d, a, r), cfg, CONTEXT, BATCH, t, "tiny")
                for name, (d, a, r) in SETTINGS.items()}


@needs_programs
def test_compiled_rows_carry_a_consistent_prediction(rows):
    from jaxlm.analysis.flops import step_flops
    from jaxlm.core.config import load_config

    model = load_config(None, [*MODEL, f"model.context_length={CONTEXT}"]).model
    flops = step_flops(model, BATCH, CONTEXT, "train_step")
    for name, r in rows.items():
        if name == "cudnn_f32":  # cuDNN attention takes bfloat16 or float16 only: the row says so, unpredicted
            assert r["status"] == "invalid" and "float" in r["error"]
            assert (r["predicted_step_ms"], r["predicted_tokens_per_s"], r["predicted_mfu"]) == (None,) * 3
            continue
        assert r["status"] == "ok" and r["predicted_label"].startswith("predicted from the compiled program")
        assert r["predicted_tokens_per_s"] == pytest.approx(BATCH * CONTEXT / (r["predicted_step_ms"] / 1e3))
        # float32 dots run as TF32 at JAX's default precision: MFU is measured against TF32's peak
        peak = DEVICES["h100-80gb"].peak_flops["tf32" if r["dtype"] == "float32" else "bfloat16"]
        assert r["predicted_mfu"] == pytest.approx(flops / (r["predicted_step_ms"] / 1e3 * peak))
        assert 0 < r["predicted_mfu"] <= 1, name
        assert sum(g["share"] for g in r["predicted_groups"]) == pytest.approx(1.0)
    ms = {name: r["predicted_step_ms"] for name, r in rows.items()}
    assert ms["bf16"] < ms["f32"] < ms["f32_full"] and ms["cudnn"] < ms["bf16"]


@needs_programs
def test_ops_target_prints_the_kernel_groups_and_writes_them(tmp_path, capsys, monkeypatch):
    from jaxlm.analysis.flops import step_flops
    from jaxlm.bench.commands import main
    from jaxlm.core.config import load_config

    monkeypatch.setattr(gpu, "compile_step", programs.compile_step)  # the float32 program of `rows`
    out = tmp_path / "kernels.json"
    sets = [x for s in [*MODEL, f"model.context_length={CONTEXT}"] for x in ("--set", s)]
    assert main(["ops", "--target", "h100-80gb", *sets, "--batch", str(BATCH), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "predicted from the compiled program for NVIDIA H100 80GB HBM3, not measured" in printed
    r = json.loads(out.read_text())
    assert [g["group"] for g in r["groups"]] == list(rl.GROUPS)
    assert all({"group", "predicted_ms", "share", "flops", "bytes"} <= set(g) for g in r["groups"])
    assert sum(g["share"] for g in r["groups"]) == pytest.approx(1.0)
    assert sum(g["predicted_ms"] for g in r["groups"]) == pytest.approx(r["predicted_step_ms"])
    # every model FLOP is a matmul of the matmul or attention groups (float32, no remat)
    model = load_config(None, [*MODEL, f"model.context_length={CONTEXT}"]).model
    matmul = sum(g["flops"] for g in r["groups"] if g["group"] in ("matmul", "attention"))
    assert matmul == pytest.approx(step_flops(model, BATCH, CONTEXT, "forward_backward"), rel=0.02)
    assert len(r["top"]) == 15 and all(k["source"] or k["group"] == "copies" for k in r["top"])
    assert r["dtype_label"] == "float32 (TF32 matmuls)" and r["matmul_precision"] == "TF32"
    assert "float32 (TF32 matmuls)" in printed
    # the loss is its own group, of the kernels jaxlm/nn/loss.py computes itself (not the model it calls)
    assert main(["ops", "--target", "h100-80gb", *sets, "--batch", str(BATCH), "--json", str(out), "--top", "500"]) == 0
    ops = json.loads(out.read_text())["ops"]
    loss = [o for o in ops if o["group"] == "loss"]
    assert loss and all(o["source"].startswith("jaxlm/nn/loss.py") for o in loss)
    assert all(o["group"] in ("loss", "matmul") for o in ops if o["source"].startswith("jaxlm/nn/loss.py"))

    # --top below 15 is honoured; a calibration file (every group measured at twice its prediction) scales every
    # kernel, and the label says which file
    groups = {g["group"]: calibration.Ratio(2.0 * g["predicted_ms"], g["predicted_ms"]) for g in r["groups"]
              if g["predicted_ms"]}
    path = calibration.save(calibration.Calibration("h100-80gb", "2026-12-07", "a test", groups), tmp_path / "c.json")
    assert main(["ops", "--target", "h100-80gb", *sets, "--batch", str(BATCH), "--json", str(out), "--top", "5",
                 "--calibration", str(path)]) == 0
    scaled = json.loads(out.read_text())
    assert (len(scaled["top"]), len(scaled["ops"])) == (5, 5)
    assert scaled["predicted_step_ms"] == pytest.approx(2 * r["predicted_step_ms"])
    assert f"calibrated by {path} (measured on h100-80gb, 2026-12-07)" in scaled["label"]


@needs_programs
def test_cudnn_calls_show_by_name_in_the_ops_table(tmp_path, monkeypatch):
    from jaxlm.bench.commands import main

    monkeypatch.setattr(gpu, "compile_step", programs.compile_step)  # the cuDNN program of `rows`
    out = tmp_path / "kernels.json"
    sets = [x for s in [*MODEL, f"model.context_length={CONTEXT}", 'compute.dtype="bfloat16"',
                        'compute.attention="cudnn"'] for x in ("--set", s)]
    assert main(["ops", "--target", "h100-80gb", *sets, "--batch", str(BATCH), "--json", str(out), "--top", "40"]) == 0
    ops = {o["op"].split()[0] for o in json.loads(out.read_text())["ops"] if o["group"] == "attention"}
    assert {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"} <= ops
