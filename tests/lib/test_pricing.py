"""Kernels priced by what they touch and by their shape (jaxlm.predict.cost, efficiency, roofline): in-place
updates by their updates, host copies over the host link, GEMMs by their tile waves, fused attention by its blocks
and exponentials, bandwidth by the bytes a kernel moves; every constant read from the device table, with its
source. Hand-written HLO (tests/lib/hlo/) and hand-computed figures."""

import math
from pathlib import Path

import pytest

from jaxlm.analysis import devices
from jaxlm.analysis.devices import DEVICES, Sourced
from jaxlm.predict import efficiency
from jaxlm.predict import roofline as rl
from jaxlm.predict.cost import Attention, Gemm


def _hlo(name: str) -> str:
    return (Path(__file__).parent / "hlo" / f"{name}.hlo").read_text()


# Hand-picked rates: a 132-SM GPU at 800 TFLOP/s bf16 in full waves, 3 TB/s, 50 GB/s to the host.
RATES = rl.DeviceRates({"bf16": 800e12, "tf32": 400e12, "fp32": 60e12}, memory_bandwidth=3e12, launch_seconds=2e-6,
                       host_bandwidth=50e9, sms=132, exp_rate=4e12)


def test_in_place_updates_cost_their_updates_not_their_operand():
    kernels = {k.name: k for k in rl.predict(_hlo("in_place"), RATES).kernels}
    updates, indices, row = 64 * 4, 64 * 2 * 4, 1000 * 4
    # the loss's scatter-add into a parameter: its positions read (a scatter-add adds to them) and written, the
    # indices and updates read; not the 256 kB logits twice
    assert kernels["in_place"].bytes == updates + indices + updates + updates
    # a scatter into a buffer the fusion builds writes all of it
    assert kernels["fresh"].bytes == indices + updates + 64 * 1000 * 4
    # unfused: in place as well (copy insertion puts any copy it needs before it, a kernel of its own)
    assert kernels["bare"].bytes == 2 * updates + indices + updates
    # a dynamic-update-slice of a parameter, returned through a bitcast: the row read and written, the index read
    assert kernels["put"].bytes == row + 4 + row
    assert kernels["in_place"].seconds == pytest.approx(kernels["in_place"].bytes / 3e12 + 2e-6)


def test_a_fusion_reads_only_what_it_gathers_of_a_converted_parameter():
    """The loss gathers each target's logit from the bf16 logits through a float32 conversion: 1024 values read,
    not the whole 100 MB block (the fusion converts only the elements the gather takes)."""
    text = """HloModule gather

%pick (logits: bf16[1024,50257], idx: s32[1024,2]) -> f32[1024] {
  %logits = bf16[1024,50257]{1,0} parameter(0)
  %f = f32[1024,50257]{1,0} convert(%logits)
  %idx = s32[1024,2]{1,0} parameter(1)
  %g = f32[1024,1,1]{2,1,0} gather(%f, %idx), offset_dims={1,2}, start_index_map={0,1}, slice_sizes={1,1}
  ROOT %r = f32[1024]{0} bitcast(%g)
}

ENTRY %main (logits: bf16[1024,50257], idx: s32[1024,2]) -> f32[1024] {
  %logits = bf16[1024,50257]{1,0} parameter(0)
  %idx = s32[1024,2]{1,0} parameter(1)
  ROOT %picked = f32[1024]{0} fusion(%logits, %idx), kind=kLoop, calls=%pick
}
"""
    (k,) = rl.predict(text, RATES).kernels
    assert k.bytes == 1024 * 4 + 1024 * 2 * 4 + 1024 * 4  # the gathered values, the indices, the result


def test_host_copies_are_priced_over_the_host_link():
    kernels = {k.name: k for k in rl.predict(_hlo("host_copies"), RATES).kernels}
    nbytes = 2048 * 256 * 2
    for name in ("out", "in"):  # to host memory (S(5)) and back
        assert (kernels[name].bound, kernels[name].group) == ("host", "copies")
        assert kernels[name].seconds == pytest.approx(nbytes / 50e9 + 2e-6)
    assert kernels["local"].bound == "launch"  # device to device: 2 MiB at the memory bandwidth, under the launch
    assert kernels["local"].seconds == pytest.approx(2 * nbytes / 3e12 + 2e-6)
    with pytest.raises(ValueError, match="host_bandwidth"):
        rl.predict(_hlo("host_copies"), rl.DeviceRates({"bf16": 1e12}, memory_bandwidth=1e11, launch_seconds=1e-6))


def test_a_gemm_one_tile_over_a_whole_wave_is_slower_per_flop_than_one_that_fills_it():
    kernels = {k.name: k for k in rl.predict(_hlo("gemm_waves"), RATES).kernels}
    filled, over = kernels["filled"], kernels["over"]
    # 3072 x 1408 in 256 x 128 tiles: 12 x 11 = 132 tiles, one wave of 132 SMs; 1792 x 2432: 7 x 19 = 133 tiles, a
    # second wave for the last one
    assert (filled.bound, over.bound) == ("compute", "compute")
    assert (filled.shape_class, over.shape_class) == ("gemm: 1-4 waves", "gemm: 1-4 waves")
    assert filled.seconds == pytest.approx(filled.flops / 800e12 + 2e-6)
    wave = 2 * 256 * 128 * 8192 / (800e12 / 132)  # one tile's K loop on one SM
    assert over.seconds == pytest.approx(2 * wave + 2e-6)
    assert over.seconds / over.flops > 1.9 * filled.seconds / filled.flops


def test_a_gemm_under_a_wave_splits_its_k_and_pays_the_partials_in_memory():
    (wgrad,) = [k for k in rl.predict(_hlo("gemm_waves"), RATES).kernels if k.name == "wgrad"]
    # 768 x 768: 3 x 6 = 18 tiles on 132 SMs; K = 65536 split 7 ways (126 blocks, one wave)
    seconds, partials, cls = efficiency.gemm(Gemm(1, 768, 768, 65536, "bf16"), 800e12, 132)
    assert cls == "gemm: split-K" and partials == 2 * 7 * 768 * 768 * 4
    assert seconds == pytest.approx(132 * 2 * 256 * 128 * math.ceil(65536 / 7) / 800e12)
    assert wgrad.shape_class == "gemm: split-K"
    assert wgrad.seconds == pytest.approx(max(seconds, (wgrad.bytes + partials) / 3e12) + 2e-6)
    # without an SM count a GEMM costs its FLOPs (the hand-written rates of the older tests)
    flat = efficiency.gemm(Gemm(1, 768, 768, 65536, "bf16"), 800e12, None)
    assert flat == (pytest.approx(2 * 768**2 * 65536 / 8e14), 0.0, None)


def test_attention_is_priced_by_its_blocks_and_exponentials_from_the_device_table(monkeypatch):
    a = Attention(batch=4, heads=16, q_len=8448, k_len=8448, d=128, dv=128, causal=False, window=0, backward=False,
                  cls="bf16")
    # the FlashAttention-3 paper's Table 2 shape: 4 x 16 heads x 66 blocks of 128 queries = 4224 thread blocks, 32
    # whole waves of 132; per score 4 x 128 matmul FLOPs and one exponential
    scores = 4 * 16 * 8448**2
    assert efficiency.attention(a, 800e12, 4e12, 132) == (pytest.approx(scores * 512 / 800e12 + scores / 4e12),
                                                          "attention: forward")
    causal = Attention(1, 1, 256, 256, 64, 64, True, 0, True, "bf16")
    assert efficiency.attention_blocks(causal) == 3  # of 2 x 2 blocks: the diagonal ones whole, the one below
    h100 = DEVICES["h100-80gb"]
    assert efficiency.exp_rate(h100) == pytest.approx(16 * 132 * 1.98e9)  # devices.EXP_PER_SM_CLOCK
    monkeypatch.setattr(devices, "EXP_PER_SM_CLOCK", Sourced(32, "a planted figure"))
    monkeypatch.setattr(devices, "ATTENTION_BLOCK", Sourced(64, "a planted figure"))
    assert efficiency.exp_rate(h100) == pytest.approx(32 * 132 * 1.98e9)
    assert efficiency.attention_blocks(causal) == 10  # 4 x 4 blocks of 64: 4 on the diagonal, 6 below


def test_bandwidth_follows_the_bytes_a_kernel_moves(monkeypatch):
    launch = devices.KERNEL_LAUNCH_S.value
    assert efficiency.effective_bandwidth(4e6, 3e12) == pytest.approx(4e6 / (4e6 / 3e12 + launch))
    assert efficiency.effective_bandwidth(4e6, 3e12) < 0.5 * 3e12 < efficiency.effective_bandwidth(4e9, 3e12)
    # a memory-bound kernel of the roofline moves its bytes at exactly that bandwidth (RATES: the table's launch)
    assert RATES.launch_seconds == launch
    (local,) = [k for k in rl.predict(_hlo("host_copies"), RATES).kernels if k.name == "local"]
    assert local.seconds == pytest.approx(local.bytes / efficiency.effective_bandwidth(local.bytes, 3e12))
    monkeypatch.setattr(devices, "KERNEL_LAUNCH_S", Sourced(1e-6, "a planted figure"))
    assert efficiency.effective_bandwidth(4e6, 3e12) == pytest.approx(4e6 / (4e6 / 3e12 + 1e-6))
    assert rl.device_rates(DEVICES["h100-80gb"]).launch_seconds == 1e-6


def test_every_shape_constant_names_its_source():
    for name, constant in devices.SHAPE_CONSTANTS.items():
        assert isinstance(constant, Sourced) and constant is getattr(devices, name)
        assert any(word in constant.source for word in ("NVIDIA", "FlashAttention", "CUDA")), name
    assert Path(__file__).resolve().parents[2].joinpath(devices.MEASURED).is_file()  # the measured rates' record
