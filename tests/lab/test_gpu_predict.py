"""deliverables.gpu.predict: a profiler trace's kernels are matched to the compiled program's kernels by the HLO
instruction that launched them, and summed per kernel group beside the roofline's prediction (a synthetic trace of
known durations over a real compiled program); the trace reader keeps the device's kernels and their names."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from deliverables.gpu import predict
from deliverables.gpu.predict import Event
from deliverables.gpu.profile import read_events
from jaxlm.core.errors import DataError, UsageError
from jaxlm.predict import calibration, roofline

RATES = roofline.DeviceRates({"bf16": 1e12, "tf32": 1e12, "fp32": 1e11}, memory_bandwidth=1e10, launch_seconds=1e-6)
SHAPED = roofline.DeviceRates({"bf16": 1e12, "tf32": 1e12, "fp32": 1e11}, memory_bandwidth=1e10, launch_seconds=1e-6,
                              sms=132, exp_rate=4e12)  # GEMMs priced by their waves: each gets a shape class
CALLS = 3


@pytest.fixture(scope="module")
def program():
    """A small program compiled on this machine: a matmul, a softmax, another matmul."""
    f = jax.jit(lambda a, b, c: jax.nn.softmax(a @ b, axis=-1) @ c)
    x = jnp.ones((128, 128), jnp.float32)
    text = f.lower(x, x, x).compile().as_text()
    return text, roofline.predict(text, RATES)


def _events(prediction, module: str) -> list[Event]:
    """Each kernel run CALLS times: matmuls at twice their predicted time, the rest at it."""
    out = []
    for k in prediction.kernels:
        us = 1e6 * k.total_seconds * (2 if k.group == "matmul" else 1)
        out += [Event(f"kernel_{i}", us, k.name, module) for i in range(CALLS)]
    return out


def test_a_trace_is_summed_per_group_beside_the_prediction(program):
    text, p = program
    module = predict.module_name(text)
    assert module.startswith("jit_")
    noise = [Event("MemcpyD2D", 50.0 * CALLS, "", ""),  # a copy no instruction launched
             Event("other", 1e6, p.kernels[0].name, "jit_other")]  # another program's kernel of the same name
    res = predict.compare(p, _events(p, module) + noise, CALLS, module)
    groups = {g["group"]: g for g in res["groups"]}
    assert [g["group"] for g in res["groups"]] == list(roofline.GROUPS)
    for g in p.groups():
        factor = 2 if g.group == "matmul" else 1
        assert groups[g.group]["predicted_ms"] == pytest.approx(1e3 * g.seconds)
        assert groups[g.group]["measured_ms"] == pytest.approx(factor * 1e3 * g.seconds)
        if g.seconds:
            assert groups[g.group]["measured_over_predicted"] == pytest.approx(factor)
    matmul = groups["matmul"]["predicted_ms"]
    assert matmul > 0
    measured = 1e3 * p.seconds + matmul
    assert res["measured_ms"] == pytest.approx(measured)
    assert res["error"] == pytest.approx(1e3 * p.seconds / measured - 1)
    assert res["group_abs_error"] == pytest.approx(matmul / measured)
    assert res["unmatched_ms"] == pytest.approx(0.05) and res["unmatched_top"][0]["name"] == "MemcpyD2D"
    assert res["matched_share"] == pytest.approx(measured / (measured + 0.05))
    assert res["kernels"][0]["group"] == "matmul"  # the largest measured kernels first


def test_a_calibration_fitted_on_a_synthetic_trace_scales_later_predictions(program, tmp_path, monkeypatch):
    """The profile step's fit: each group's and shape class's measured over predicted time, written, read back and
    applied; a kernel takes its class's ratio, else its group's."""
    text, _ = program
    p = roofline.predict(text, SHAPED)
    module = predict.module_name(text)
    gemms = {k.shape_class for k in p.kernels if k.shape_class}
    assert gemms and all(c.startswith("gemm: ") for c in gemms)
    events = []
    for k in p.kernels:  # GEMMs at 3x their predicted time, the rest of the matmul group (none) 2x, the others 1x
        factor = 3 if k.shape_class else 2 if k.group == "matmul" else 1
        events += [Event(f"kernel_{i}", 1e6 * k.total_seconds * factor, k.name, module) for i in range(CALLS)]
    cal = predict.calibrate(p, events, CALLS, module, "h100-80gb", "a synthetic trace")
    assert {c: r.ratio for c, r in cal.shape_classes.items()} == {c: pytest.approx(3) for c in gemms}
    assert cal.groups["matmul"].ratio == pytest.approx(3) and cal.groups["other elementwise"].ratio == pytest.approx(1)
    loaded = calibration.load(calibration.save(cal, tmp_path / "h100-80gb.json"))
    assert (loaded.device, loaded.source, loaded.groups) == ("h100-80gb", "a synthetic trace", cal.groups)
    scaled = roofline.predict(text, SHAPED, loaded)
    for before, after in zip(p.kernels, scaled.kernels):
        assert after.seconds == pytest.approx(before.seconds * (3 if before.shape_class else 1))
    assert scaled.calibration == f"calibrated by {tmp_path / 'h100-80gb.json'} (measured on h100-80gb, {cal.date})"
    # the committed one for the target is taken by default and said so; `none` and another GPU's are not taken
    heard = []
    assert calibration.resolve(None, "h100-80gb", heard.append) is None  # nothing committed (yet) in the package
    monkeypatch.setattr(calibration, "CALIBRATIONS", tmp_path)
    assert calibration.resolve(None, "h100-80gb", heard.append).groups == cal.groups
    assert heard and "committed for h100-80gb" in heard[0]
    assert calibration.resolve("none", "h100-80gb") is None
    with pytest.raises(UsageError, match="measured on h100-80gb, the target is a100-80gb"):
        calibration.resolve(str(tmp_path / "h100-80gb.json"), "a100-80gb")


@pytest.mark.parametrize("broken, why", [("{", "not a calibration file"), ('{"device": "x"}', "no key 'groups'"),
                                         ("PRICING", "fitted to pricing version")])
def test_a_broken_calibration_file_is_one_line_naming_it(broken, why, tmp_path):
    path = tmp_path / "cal.json"
    if broken == "PRICING":
        old = calibration.Calibration("h100-80gb", "2026-01-01", "x", pricing=roofline.PRICING_VERSION - 1)
        calibration.save(old, path)
    else:
        path.write_text(broken)
    with pytest.raises(DataError, match=f"--calibration {path}: .*{why}"):
        calibration.load(path)


def test_kernels_are_matched_by_their_own_name_when_the_trace_names_no_instruction(program):
    text, p = program
    k = next(k for k in p.kernels if "." in k.name)
    event = Event(k.name.replace(".", "_"), 1e3 * CALLS, "", "")  # XLA's kernel for fusion.3 is fusion_3
    res = predict.compare(p, [event], CALLS)
    assert res["measured_ms"] == pytest.approx(1.0) and res["unmatched_ms"] == 0
    assert res["kernels"][0]["kernel"] == k.name


def test_the_trace_reader_keeps_the_gpu_streams_kernels(tmp_path):
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13(Compute)"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "python"}}]
    kernels = [{"ph": "X", "pid": 1, "tid": 7, "name": "loop_add_fusion_3", "dur": 5.5,
                "args": {"hlo_op": "loop_add_fusion.3", "hlo_module": "jit_train_step"}},
               {"ph": "X", "pid": 1, "tid": 7, "name": "MemcpyD2D", "dur": 2.0, "args": {}},
               {"ph": "X", "pid": 2, "tid": 1, "name": "PjitFunction(train_step)", "dur": 99.0},
               {"ph": "X", "pid": 1, "tid": 7, "name": "end: loop_add_fusion_3", "dur": 0.1}]
    path = tmp_path / "host.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": meta + kernels}, f)
    assert read_events(path) == [Event("loop_add_fusion_3", 5.5, "loop_add_fusion.3", "jit_train_step"),
                                 Event("MemcpyD2D", 2.0, "", "")]


def test_rates_and_figures_follow_the_device_table():
    from jaxlm.analysis.devices import DEVICES

    h100 = DEVICES["h100-80gb"]
    r = roofline.device_rates(h100)
    full = 798e12 * 2112 / 2048  # the 8192^3 bf16 matmul measured on an H100 (2048 tiles in 16 waves of 132)
    assert r.matmul_flops["bf16"] == pytest.approx(full)
    assert r.matmul_flops["tf32"] == pytest.approx(full / 2)  # TF32's dense peak is half of bf16's
    assert r.memory_bandwidth == pytest.approx(3.0e12)  # the device-to-device copy measured likewise
    label = f"{full / 1e12:.0f} TFLOP/s bf16 matmuls in full waves, 3.0 TB/s"
    assert label in predict.target()[1] or jax.default_backend() == "gpu"
    one_ms = roofline.Prediction((roofline.Kernel("k", "fusion", "matmul", "", "", "", "", 1.0, 1.0, "bf16", 1e-3,
                                                  "compute", 1),), ())
    f = predict.figures(one_ms, tokens=4096, model_flops=494.5e9, dtype="bfloat16", device=h100, label="x")
    assert f["predicted_step_ms"] == pytest.approx(1.0) and f["predicted_tokens_per_s"] == pytest.approx(4.096e6)
    assert f["predicted_mfu"] == pytest.approx(0.5)  # 494.5 GFLOP in 1 ms = half of 989 TFLOP/s
    if jax.default_backend() != "gpu":
        device, label = predict.target()
        assert device.name == "h100-80gb" and label.endswith("no prediction")
