"""The roofline over the GPU compiler's program (jaxlm.predict.roofline): hand-written HLO for the parser's
edge cases, and programs compiled for an abstract H100 (the gpu-compile extra) against hand-computed figures."""

from pathlib import Path

import numpy as np
import pytest

from jaxlm.analysis.devices import DEVICES, KERNEL_LAUNCH_S
from jaxlm.predict import hlo
from jaxlm.predict import roofline as rl
from jaxlm.predict.cost import dtype_class, visible_pairs
from tests.lib import gpu_programs as programs
from tests.lib.gpu_programs import needs_programs
from tests.train_helpers import needs_compiler


def _hlo(name: str) -> str:
    """A hand-written HLO module of tests/lib/hlo/ (the printed form of XLA's optimised programs)."""
    return (Path(__file__).parent / "hlo" / f"{name}.hlo").read_text()


# The device table's H100 at its datasheet figures (dense peaks, memory bandwidth, an NVLink 4 direction), not the
# achieved shares nor the tile model device_rates prices with: the time of one kernel is then checkable by hand.
_H100 = DEVICES["h100-80gb"]
PEAK, BANDWIDTH, LINK, LAUNCH = _H100.peak_flops, _H100.bandwidth, _H100.link, KERNEL_LAUNCH_S.value
H100 = rl.DeviceRates({c: PEAK[k] for c, k in rl.PEAK_KEYS.items()}, memory_bandwidth=BANDWIDTH, launch_seconds=LAUNCH,
                      link_bandwidth=LINK)
SLOW = rl.DeviceRates({"bf16": 1e12, "tf32": 5e11, "fp32": 1e11}, memory_bandwidth=1e11, launch_seconds=1e-6,
                      link_bandwidth=1e10)

LOOPS = _hlo("nested_loops")


def test_nested_loops_multiply_their_trip_counts():
    p = rl.predict(LOOPS, SLOW)
    counts = {k.name: k.count for k in p.kernels}
    assert counts == {"mm": 12, "next": 12, "step": 3}
    mm = next(k for k in p.kernels if k.name == "mm")
    assert (mm.flops, mm.bytes, mm.dtype_class, mm.bound) == (2 * 64 * 32 * 128, (64 * 128 + 128 * 32 + 64 * 32) * 2,
                                                              "bf16", "launch")
    # 524,288 FLOPs at 1e12 FLOP/s; 28,672 bytes at 1e11 B/s; + 1 us launch
    assert mm.seconds == pytest.approx(0.524288e-6 + 1e-6)
    assert p.seconds == pytest.approx(12 * (0.524288e-6 + 1e-6) + 15 * (8e-11 + 1e-6))
    assert p.notes == ()


def test_a_loop_without_a_known_trip_count_counts_once_and_says_so():
    p = rl.predict(LOOPS.replace('"known_trip_count":{"n":"4"},', ""), SLOW)
    assert {k.name: k.count for k in p.kernels} == {"mm": 3, "next": 3, "step": 3}
    assert p.notes == ("loop: a loop of unknown trip count, counted once",)


def test_types_of_tuples_and_commented_operands_are_parsed():
    m = hlo.parse_module(LOOPS)
    loop = m.computations["outer"].instrs["loop"]
    assert loop.shape == (hlo.Array("s32", ()), hlo.Array("bf16", (64, 128)), hlo.Array("bf16", (128, 32)))
    assert (loop.operands, loop.callees, loop.config["known_trip_count"]) == (("t",), ("inner", "cond"), {"n": "4"})
    assert hlo.nbytes(loop.shape) == 4 + 64 * 128 * 2 + 128 * 32 * 2
    assert [p.name for p in m.computations["gemm"].parameters()] == ["p0", "p1"]
    assert m.entry == "main" and m.computations["main"].root.name == "loop"


COLLECTIVES = _hlo("collectives")


def test_async_collectives_cost_their_ring_bytes_over_the_link():
    p = rl.predict(COLLECTIVES, SLOW)
    mib = 1024 * 256 * 4  # the float32 operand
    shard = 128 * 512 * 2  # the bf16 operand
    link = {"ars": 2 * 7 / 8 * mib, "ags": 3 * shard, "rss": 7 / 8 * mib, "cps": shard, "a2a": 7 / 8 * mib}
    assert {k.name for k in p.kernels} == set(link)  # the -done halves launch nothing
    for k in p.kernels:
        assert (k.group, k.bound, k.count) == ("collectives", "link", 1)
        assert k.seconds == pytest.approx(link[k.name] / 1e10 + 1e-6), k.name
    assert p.groups()[rl.GROUPS.index("collectives")].share == pytest.approx(1.0)


def test_collectives_need_a_link_bandwidth():
    rates = rl.DeviceRates({"bf16": 1e12}, memory_bandwidth=1e11, launch_seconds=1e-6)
    with pytest.raises(ValueError, match="link_bandwidth"):
        rl.predict(COLLECTIVES, rates)


SLICES = _hlo("slices_and_conditional")


def test_a_fusion_reads_only_its_slices_and_writes_only_its_update():
    p = rl.predict(SLICES, SLOW)
    fused = next(k for k in p.kernels if k.name == "fused")
    assert fused.bytes == 1024 * 4 + 4 + 1024 * 4  # one row read, the index, one row written in place
    assert (fused.group, fused.flops) == ("other elementwise", 0)


def test_a_conditional_counts_its_costliest_branch():
    p = rl.predict(SLICES, SLOW)
    assert [k.name for k in p.kernels] == ["fused", "c"]  # the copy of the true branch, not the empty false one
    assert next(k for k in p.kernels if k.name == "c").group == "copies"
    assert p.notes == ("pick: a conditional, its costliest of 2 branches counted",)


LIBRARY_CALLS = _hlo("library_calls")


def test_library_calls_count_their_matmuls_and_leave_out_workspaces():
    p = rl.predict(LIBRARY_CALLS, SLOW)
    g, f = p.kernels
    assert (g.kind, g.flops, g.dtype_class, g.group) == ("__cublas$gemm", 2 * 64 * 32 * 256, "bf16", "matmul")
    assert g.bytes == (64 * 256 + 256 * 32 + 64 * 32) * 2  # not the 4 MiB workspace
    pairs = 64 * 65 // 2 + (256 - 64) * 64  # window of 64 keys: the first 64 queries see 1..64, the rest 64
    assert (f.group, f.flops) == ("attention", 2 * 4 * pairs * 2 * (64 + 64))


@pytest.mark.parametrize("window", [0, 1, 5, 63, 64, 200, 256, 1000])
@pytest.mark.parametrize("q_len", [1, 7, 64, 256])
def test_visible_pairs_count_the_mask(q_len, window):
    i, j = np.ogrid[:q_len, :q_len]
    mask = j <= i
    if window:
        mask &= j > i - window  # cuDNN's window length: the query and window - 1 keys before it
    assert visible_pairs(q_len, q_len, True, window) == mask.sum()
    assert visible_pairs(q_len, 2 * q_len, False) == 2 * q_len * q_len


def test_dtype_classes_follow_precision_and_algorithm():
    assert dtype_class(("f32", "f32")) == ("tf32", 1)  # JAX's default precision on NVIDIA GPUs
    assert dtype_class(("f32", "f32"), "{highest,highest}") == ("fp32", 1)
    assert dtype_class(("bf16", "bf16")) == ("bf16", 1)
    assert dtype_class(("f16", "f16")) == ("bf16", 1)
    assert dtype_class(("f8e4m3fn", "f8e5m2")) == ("fp8", 1)
    assert dtype_class(("s8", "s8")) == ("int8", 1)
    assert dtype_class(("f32", "pred")) == ("tf32", 1)
    assert dtype_class(("f32", "f32"), "{highest,highest}", "dot_bf16_bf16_f32_x3") == ("bf16", 3)
    assert dtype_class(("f32", "f32"), None, "ALG_DOT_TF32_TF32_F32") == ("tf32", 1)


def test_a_dtype_class_without_a_rate_is_an_error():
    with pytest.raises(ValueError, match="no rate for dtype class 'bf16'"):
        rl.predict(LOOPS, rl.DeviceRates({"tf32": 1e12}, memory_bandwidth=1e11, launch_seconds=1e-6))


FRAMES = _hlo("source_frames")


def test_kernels_are_grouped_by_their_source():
    p = rl.predict(FRAMES, SLOW)
    groups = {k.name: k.group for k in p.kernels}
    # the flax frame of `norm` (frame 5) was called from RMSNorm: XLA prints a parent one above its id, so 4 is
    # frame 3 and 1 no parent (as in jaxlm's own programs: the outermost frame prints parent_frame_id=1)
    assert groups == {"scores": "attention", "softmax": "attention", "adam": "optimizer update",
                      "norm": "softmax/normalisation", "act": "other elementwise", "move": "copies",
                      "proj": "matmul"}
    assert next(k for k in p.kernels if k.name == "softmax").source == "jaxlm/nn/attention.py:151 _attention_xla"
    shares = [g.share for g in p.groups()]
    assert sum(shares) == pytest.approx(1.0) and [g.group for g in p.groups()] == list(rl.GROUPS)


# --------------------------------------------------------------------------- programs compiled for an H100



def _compile(fn, *shapes, dtype="bfloat16", gpus=1, specs=None):
    """fn jitted over abstract arrays of `shapes` (laid out by PartitionSpecs `specs` on a mesh axis "d") and
    compiled for `gpus` abstract H100s: its optimised HLO."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxlm.nn.attention import compiling_for
    from jaxlm.predict import target as gpu

    devices = gpu.devices(gpu.parse_target(f"h100-80gb:{gpus}"))
    mesh = Mesh(np.array(devices), ("d",))
    specs = specs or [PartitionSpec()] * len(shapes)
    args = [jax.ShapeDtypeStruct(s, dtype, sharding=NamedSharding(mesh, p)) for s, p in zip(shapes, specs)]
    with compiling_for(devices):
        return jax.jit(fn).lower(*args).compile().as_text()


@pytest.fixture(scope="module")
def steps():
    """jaxlm's train step compiled for an H100 in four settings: {name: (config, module, prediction)}."""
    out = {}
    for name in ("f32", "f32_full", "cudnn_full", "cudnn_full_scan"):
        cfg, compiled = programs.program(name)
        module = hlo.parse_module(compiled.as_text())
        out[name] = cfg, module, rl.predict(module, H100)
    return out


@needs_compiler
def test_one_large_matmul_predicts_its_hand_computed_roofline():
    n = 8192
    p = rl.predict(_compile(lambda a, b: a @ b, (n, n), (n, n)), H100)
    (k,) = p.kernels
    assert (k.flops, k.bytes, k.dtype_class, k.bound, k.group) == (2 * n**3, 3 * n * n * 2, "bf16", "compute", "matmul")
    hand = max(2 * n**3 / PEAK["bfloat16"], 3 * n * n * 2 / BANDWIDTH) + LAUNCH  # 1.11 ms of compute
    assert p.seconds == pytest.approx(hand, rel=0.02)


@needs_compiler
def test_float32_matmuls_are_priced_as_tf32_unless_precision_is_highest():
    import jax

    def classes(precision):
        text = _compile(lambda a, b: jax.numpy.dot(a, b, precision=precision), (512, 1024), (1024, 256),
                        dtype="float32")
        return {k.dtype_class for k in rl.predict(text, H100).kernels if k.flops}

    assert classes(None) == {"tf32"}
    assert classes(jax.lax.Precision.HIGHEST) == {"fp32"}


@needs_compiler
def test_a_matmul_sharded_on_its_contraction_all_reduces_over_the_link():
    from jax.sharding import PartitionSpec as P

    text = _compile(lambda a, b: a @ b, (1024, 2048), (2048, 512), gpus=8, specs=[P(None, "d"), P("d", None)])
    (ar,) = [k for k in rl.predict(text, H100).kernels if k.group == "collectives"]
    ring = 2 * 7 / 8 * 1024 * 512 * 2  # each GPU sends 2 (n - 1) / n of the bf16 result in a ring all-reduce
    assert ar.seconds == pytest.approx(ring / LINK + LAUNCH)


@needs_compiler
@pytest.mark.parametrize("window", [None, 100])
def test_cudnn_attention_flops_follow_the_causal_and_window_mask(window):
    import jax

    b, t, n, h = 2, 512, 4, 64

    def attend(q, k, v):
        local = (window, 0) if window else None
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local, implementation="cudnn")
        return out.astype("float32").sum()

    text = _compile(jax.grad(attend, argnums=(0, 1, 2)), *[(b, t, n, h)] * 3)
    fmha = {k.kind: k for k in rl.predict(text, H100).kernels if k.kind.startswith("__cudnn$fmha")}
    i, j = np.ogrid[:t, :t]
    pairs = ((j <= i) & (j >= i - (window if window else t))).sum()  # jaxlm's window: itself + `window` before
    assert fmha["__cudnn$fmhaSoftmax"].flops == 2 * b * n * pairs * 2 * h  # Q K^T and P V
    assert fmha["__cudnn$fmhaSoftmaxBackward"].flops == 2 * b * n * pairs * 5 * h  # scores again + 4 gradients
    assert {k.group for k in fmha.values()} == {"attention"}


@needs_programs
def test_a_train_steps_flops_match_the_analytic_count(steps):
    from jaxlm.analysis.flops import forward_flops, step_flops

    cfg, _, p = steps["f32"]
    m, b, t = cfg.model, cfg.data.batch_size, cfg.model.context_length
    assert p.flops == pytest.approx(step_flops(m, b, t, "train_step"), rel=0.02)
    # remat full recomputes each block's forward in the backward pass, but for its last matmul (the FFN's down
    # projection), whose output the backward does not need
    cfg, _, p = steps["f32_full"]
    fwd = forward_flops(m, t)
    recompute = b * (fwd.attention + fwd.ffn * 2 / 3)
    assert p.flops == pytest.approx(step_flops(m, b, t, "train_step") + recompute, rel=0.02)


@needs_programs
def test_a_scanned_model_predicts_the_unrolled_ones_time(steps):
    """With remat full both layouts keep only each layer's input; under the scan's default policy (the matmul
    outputs saved) each layer's saved outputs are also copied into the stacked loop carry, a real cost."""
    unrolled, scanned = steps["cudnn_full"][2], steps["cudnn_full_scan"][2]
    assert scanned.flops == pytest.approx(unrolled.flops, rel=1e-3)
    assert scanned.seconds == pytest.approx(unrolled.seconds, rel=0.05)
    layers = steps["cudnn_full"][0].model.num_layers
    assert max(k.count for k in scanned.kernels) == layers and max(k.count for k in unrolled.kernels) == 1


@needs_programs
def test_predicted_mfu_never_exceeds_one(steps):
    from jaxlm.analysis.flops import step_flops

    ideal = rl.DeviceRates(H100.matmul_flops, memory_bandwidth=1e30, launch_seconds=0.0)  # only matmuls cost
    mfu = {}
    for name, (cfg, module, p) in steps.items():
        peak = H100.matmul_flops["tf32" if cfg.compute.dtype == "float32" else "bf16"]  # what the dots run as
        model = step_flops(cfg.model, cfg.data.batch_size, cfg.model.context_length, "train_step")
        mfu[name] = p.mfu(model, peak), rl.predict(module, ideal).mfu(model, peak)
        assert 0 < mfu[name][0] <= 1 and mfu[name][0] < mfu[name][1], name
        assert sum(g.share for g in p.groups()) == pytest.approx(1.0)
    # with only matmuls to pay for, every model FLOP is a matmul FLOP (AdamW's few elementwise ones aside)
    assert mfu["f32"][1] == pytest.approx(1.0, abs=0.02)
    assert mfu["f32_full"][1] < 0.85  # the recomputed forward is work, not model FLOPs
    seconds = {name: p.seconds for name, (_, _, p) in steps.items()}
    assert seconds["f32"] < seconds["f32_full"] and seconds["cudnn_full"] < seconds["f32_full"]
