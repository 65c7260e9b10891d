"""How fast a kernel runs by its shape, from the constants of the device table (jaxlm.analysis.devices, each with
its source): GEMMs by tile and wave quantisation over the SMs, fused attention by its blocks and exponentials,
bandwidth by the bytes a kernel moves.

GEMMs. The output is cut into GEMM_TILE tiles (the orientation that wastes less), one thread block each, run in
waves of one per SM; a wave costs one tile's whole K loop at 1/SMs of the GPU's full-wave matmul rate. So a GEMM
whose tiles fill the SMs in whole waves runs at that rate, one with a tile more than a wave takes a second wave
for it, and a small or skinny one pays for its padded tiles. A GEMM with fewer tiles than SMs splits its K
dimension over the idle SMs (split-K, a slice of at least the tile's smaller side of K), paying a reduction of float32
partial results in memory. The full-wave rate is the measured 8192^3 matmul's rate over that GEMM's own wave
efficiency (0.97 on an H100), so the measurement and the model agree on the one shape measured.

Fused attention. Per (query, key) pair its matmuls (forward 2, backward 5) at the full-wave rate and one
exponential at the multi-function units' rate (EXP_PER_SM_CLOCK x SMs x clock), one after the other; a causal
mask computes whole ATTENTION_BLOCK x ATTENTION_BLOCK blocks on the diagonal, and the thread blocks (one per
block of queries forward, of keys backward) run in waves over the SMs.

Bandwidth. A kernel moving b bytes reaches b / (b / bandwidth + KERNEL_LAUNCH_S) of it (effective_bandwidth).
"""

from __future__ import annotations

import math

from jaxlm.analysis import devices
from jaxlm.analysis.devices import DEVICES, UNMEASURED_REFERENCE, Device
from jaxlm.predict.cost import Attention, Gemm

MEASURED_GEMM = 8192  # the measured matmul's size (docs/results/measured-rates.md): 8192^3 in bfloat16
# Shape classes of a GEMM (calibrated separately: jaxlm.predict.calibration): its tiles against the SMs.
GEMM_CLASSES = ("gemm: large (>= 4 waves)", "gemm: 1-4 waves", "gemm: under a wave", "gemm: split-K")
ATTENTION_CLASSES = ("attention: forward", "attention: backward")


def wave_efficiency(blocks: int, sms: int) -> float:
    """Share of the SMs' time a grid of `blocks` equal thread blocks keeps busy, run in waves of one per SM."""
    return blocks / (math.ceil(blocks / sms) * sms)


def full_wave_share(device: Device) -> float:
    """Achieved over dense peak for a GEMM whose tiles fill whole waves: the measured matmul's share over its own
    wave efficiency on the GPU it was measured on; for a GPU without measurements the H100's (the device table's
    one rule)."""
    measured = device if device.measured_matmul and device.cuda else DEVICES[UNMEASURED_REFERENCE]
    tm, tn = devices.GEMM_TILE.value
    tiles = math.ceil(MEASURED_GEMM / tm) * math.ceil(MEASURED_GEMM / tn)
    return measured.matmul_share / wave_efficiency(tiles, measured.cuda.sms)


def exp_rate(device: Device) -> float | None:
    """Exponentials per second of the GPU's multi-function units (None without an SM count)."""
    c = device.cuda
    return c and devices.EXP_PER_SM_CLOCK.value * c.sms * c.clock_ghz * 1e9


def _gemm_plan(g: Gemm, sms: int) -> tuple[float, int, int, str]:
    """(seconds per unit rate, K slices, tiles, shape class) of the cheaper tile orientation."""
    best, tile = None, devices.GEMM_TILE.value
    for tm, tn in (tile, tile[::-1]):
        tiles = g.batch * math.ceil(g.m / tm) * math.ceil(g.n / tn)
        split = max(1, min(sms // tiles, g.k // min(tile))) if tiles < sms else 1
        waves = math.ceil(tiles * split / sms)
        work = waves * sms * 2.0 * tm * tn * math.ceil(g.k / split) * g.passes  # FLOPs the waves take the time of
        if best is None or work < best[0]:
            best = work, split, tiles
    work, split, tiles = best
    cls = GEMM_CLASSES[3] if split > 1 else GEMM_CLASSES[0] if tiles >= 4 * sms else GEMM_CLASSES[
        1] if tiles >= sms else GEMM_CLASSES[2]
    return work, split, tiles, cls


def gemm(g: Gemm, rate: float, sms: int | None) -> tuple[float, float, str | None]:
    """(seconds of compute, extra bytes, shape class) of one GEMM at full-wave rate `rate` on `sms` SMs; without an
    SM count, its FLOPs at `rate` (no shape model)."""
    if not sms:
        return g.flops / rate, 0.0, None
    work, split, _, cls = _gemm_plan(g, sms)
    partials = 2.0 * split * g.batch * g.m * g.n * 4 if split > 1 else 0.0  # float32 slices written, then read
    return work / rate, partials, cls


def attention_blocks(a: Attention) -> int:
    """ATTENTION_BLOCK x ATTENTION_BLOCK blocks of scores one (batch, head) computes: all of them, or under a
    causal mask (and window) those that hold a visible pair, the diagonal ones whole."""
    b = devices.ATTENTION_BLOCK.value
    rows, cols = math.ceil(a.q_len / b), math.ceil(a.k_len / b)
    if not a.causal:
        return rows * cols
    total = 0
    for i in range(rows):
        last = min(cols - 1, ((i + 1) * b - 1) // b)
        first = max(0, (i * b - a.window + 1) // b) if a.window else 0
        total += max(0, last - first + 1)
    return total


def attention(a: Attention, rate: float, exps: float | None, sms: int | None) -> tuple[float, str | None]:
    """(seconds of compute, shape class) of one fused attention call; without an SM count, its FLOPs at `rate`."""
    if not sms or not exps:
        return a.flops / rate, None
    block = devices.ATTENTION_BLOCK.value
    scores = a.batch * a.heads * attention_blocks(a) * block**2
    blocks = a.batch * a.heads * math.ceil((a.k_len if a.backward else a.q_len) / block)
    seconds = (scores * a.per_pair / rate + scores / exps) / wave_efficiency(blocks, sms)
    return seconds, ATTENTION_CLASSES[a.backward]


def effective_bandwidth(nbytes: float, bandwidth: float) -> float:
    """Bytes/s a kernel moving `nbytes` reaches, its fixed cost (KERNEL_LAUNCH_S) included: a few MB never reach
    `bandwidth`."""
    return nbytes / (nbytes / bandwidth + devices.KERNEL_LAUNCH_S.value)
