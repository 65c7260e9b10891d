"""Predicted GPU time of a compiled program: every kernel of the GPU compiler's optimised HLO, priced by its shape.

    compiled = jax.jit(step).lower(...).compile()   # for a GPU, e.g. an abstract H100 (`--target`)
    p = predict(compiled.as_text(), device_rates(DEVICES["h100-80gb"]))   # the GPU's achieved rates
    p.seconds, p.groups(), p.top(15), summary(p)

The kernels are what the GPU would launch: each instruction of the entry computation and of the loop bodies
it runs (a `while` with a known trip count runs its body that many times; nested loops multiply), not the
instructions inside a fusion. Each costs

    max(compute by shape, bytes read + written / memory bandwidth) + launch

where compute by shape (jaxlm.predict.efficiency) is a GEMM's tile waves over the SMs at the GPU's full-wave
matmul rate of its dtype class, a fused attention call's blocks of matmuls and exponentials; a collective costs
its bytes over the link (ring algorithm: an all-reduce sends 2 (n-1)/n of its bytes per GPU) + launch; a copy
between host and device memory (remat offload) its bytes over the host link (PCIe, NVLink-C2C) + launch.
Matmul FLOPs are 2 m n k per dot or convolution inside a fusion or cuBLAS call, and the cuDNN attention
kernels' own work: forward 2 matmuls, backward 5 (the scores are recomputed), over the (query, key) pairs its
mask leaves (causal: about half; a sliding window: at most window + 1 keys per query). Elementwise FLOPs are
not counted (a kernel without matmuls is priced by its bytes), as in jaxlm.analysis.flops. The bytes of a
fusion are its operands and results, a slice of an operand counting only the slice, an in-place update only
its updates (jaxlm.predict.cost). Float32 dots at JAX's default precision (no `operand_precision` in the text)
run as TF32, `highest` (JAX_DEFAULT_MATMUL_PRECISION=highest) as true float32; an `algorithm=` field overrides
(bf16_3x: three bf16 passes). A conditional counts its costliest branch; a loop of unknown trip count counts
once (`notes` says so). A calibration (jaxlm.predict.calibration: measured over predicted per kernel group and
GEMM shape class, from a profiled GPU) scales each kernel's time.
Each kernel also gets the pass it belongs to (`PHASES`, from the jax op name: `transpose(...)` is the backward
pass, `rematted_computation` the forward recomputed inside it) and the part of the model it computes
(`COMPONENTS`, from its source locations), so a prediction answers "forward against backward" and "feed-forward
against attention" as well as "which kernels".

The model ignores overlap between kernels on different streams (communication hidden behind compute), cache
reuse across kernels (L2), the smaller tiles autotuning may choose for an awkward tile count, and clock
throttling: even with achieved rather than datasheet rates it is optimistic where kernels overlap less than it
assumes and a prediction, never a measurement (docs/benchmarks.md, "Predicted GPU time", has its errors).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from jaxlm.analysis import devices
from jaxlm.analysis.devices import Device
from jaxlm.predict import efficiency, hlo
from jaxlm.predict.cost import MATMUL_PRECISION, Cost, kernel_cost
from jaxlm.predict.hlo import Computation, Instr, Module

GROUPS = ("matmul", "attention", "softmax/normalisation", "loss", "other elementwise", "optimizer update",
          "collectives", "copies")
DTYPE_CLASSES = ("bf16", "tf32", "fp32", "fp8", "int8", "fp64")  # keys of DeviceRates.matmul_flops
PEAK_KEYS = {"bf16": "bfloat16", "tf32": "tf32", "fp32": "float32"}  # dtype class -> jaxlm.analysis.devices' peak
# The pricing model's version, kept with every stored prediction (jaxlm.predict.store): bump it when a change
# moves predictions, so that stored ones are priced again.
PRICING_VERSION = 2
PHASES = ("forward", "backward", "recompute", "optimizer", "other")
# The part of the model a kernel computes: the first rule that any of its source locations ("file:function",
# innermost first) or its jax op name matches, in this order.
COMPONENTS = (
    ("optimizer and clipping", re.compile(r"^optax/|^jaxlm/training/optim\.py:")),
    ("attention (cuDNN, fused)", re.compile(r"^__cudnn\$fmha")),
    ("attention matmuls", re.compile(r"^matmul@jaxlm/nn/attention\.py:")),
    ("attention softmax and mask", re.compile(r"^jaxlm/nn/attention\.py:")),
    ("attention projections", re.compile(r"CausalSelfAttention\.")),
    ("feed-forward", re.compile(r"SwiGLU\.|SiLUFFN\.|\.ffn$")),
    ("norms", re.compile(r"RMSNorm\.")),
    ("residuals and other block work", re.compile(r"TransformerBlock\.")),
    ("output head and loss", re.compile(r"TransformerLM\.project|^jaxlm/nn/loss\.py:|:cross_entropy$")),
    ("embedding", re.compile(r"Embedding\.")),
)

# Source locations (innermost frame first; "file:function") that name a kernel's group.
SOURCE_GROUPS = (
    ("attention", re.compile(r"^jaxlm/nn/attention\.py:|dot_product_attention")),
    ("optimizer update", re.compile(r"^optax/|^jaxlm/training/optim\.py:")),
    ("loss", re.compile(r"^jaxlm/nn/loss\.py:|:cross_entropy$")),
    ("softmax/normalisation", re.compile(r"Norm\.__call__|softmax|logsumexp")),
)
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "add-dependency",
         "opt-barrier", "partition-id", "replica-id", "domain", "async-update", "async-done"}
_MOVES = {"parameter", "bitcast", "reshape", "transpose", "copy", "broadcast", "constant", "slice", "dynamic-slice",
          "concatenate", "pad", "dynamic-update-slice", "tuple", "get-tuple-element", "reverse"}


@dataclass(frozen=True)
class DeviceRates:
    """What the roofline prices with (achieved figures of one GPU, not datasheet peaks, for a realistic time).
    Without `sms` a matmul costs its FLOPs at `matmul_flops` (no shape model); with it, GEMMs and fused attention
    are priced by their tiles (jaxlm.predict.efficiency) and `matmul_flops` is the full-wave rate."""

    matmul_flops: Mapping[str, float]  # FLOP/s by dtype class (DTYPE_CLASSES)
    memory_bandwidth: float  # bytes/s, read + written
    launch_seconds: float  # per kernel launch
    link_bandwidth: float | None = None  # bytes/s each GPU sends over its links (NVLink); collectives need it
    host_bandwidth: float | None = None  # bytes/s between device and host memory; offloaded buffers need it
    sms: int | None = None  # streaming multiprocessors: the waves GEMMs and attention run in
    exp_rate: float | None = None  # exponentials/s (fused attention's softmax)


def device_rates(device: Device) -> DeviceRates:
    """A GPU's achieved rates from the device table: every dtype class it has a dense peak for, at the GPU's
    full-wave matmul share (jaxlm.predict.efficiency.full_wave_share: measured where a machine of this kind was
    measured, else the rule), its achieved bandwidths, SM count and exponential rate."""
    share = efficiency.full_wave_share(device)
    flops = {c: share * device.peak_flops[k] for c, k in PEAK_KEYS.items() if k in device.peak_flops}
    return DeviceRates(flops, device.achieved_bandwidth, devices.KERNEL_LAUNCH_S.value, device.achieved_link,
                       device.achieved_host_link, device.cuda and device.cuda.sms, efficiency.exp_rate(device))


@dataclass(frozen=True)
class Kernel:
    """One kernel of the program, priced; `seconds`, `flops` and `bytes` are per execution."""

    name: str
    kind: str  # fusion kind, custom-call target or opcode
    group: str
    op_name: str  # the jax op of its metadata
    source: str  # the innermost source location ("jaxlm/nn/attention.py:151 _attention_xla")
    phase: str  # of PHASES
    component: str  # of COMPONENTS, or "other"
    flops: float
    bytes: float
    dtype_class: str | None  # of its matmuls; None without
    seconds: float
    bound: str  # compute, memory, launch, link or host
    count: int  # executions per program run
    shape_class: str | None = None  # a GEMM's or attention call's (jaxlm.predict.efficiency), for calibration

    @property
    def total_seconds(self) -> float:
        return self.seconds * self.count


@dataclass(frozen=True)
class GroupTotal:
    group: str
    seconds: float
    share: float  # of the predicted total
    flops: float
    bytes: float
    launches: int
    bound: str  # the bound of most of the group's time ("" for an empty group)


@dataclass(frozen=True)
class Prediction:
    kernels: tuple[Kernel, ...]
    notes: tuple[str, ...]  # approximations this program needed (unknown trip counts, conditionals)
    calibration: str | None = None  # the calibration applied (its file and device), None without

    @property
    def seconds(self) -> float:
        return sum(k.total_seconds for k in self.kernels)

    @property
    def flops(self) -> float:
        return sum(k.flops * k.count for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes * k.count for k in self.kernels)

    def groups(self) -> tuple[GroupTotal, ...]:
        """Every group of GROUPS, in that order; the shares sum to 1."""
        total = self.seconds or 1.0
        out = []
        for g in GROUPS:
            ks = [k for k in self.kernels if k.group == g]
            by_bound: dict[str, float] = {}
            for k in ks:
                by_bound[k.bound] = by_bound.get(k.bound, 0.0) + k.total_seconds
            secs = sum(k.total_seconds for k in ks)
            out.append(GroupTotal(g, secs, secs / total, sum(k.flops * k.count for k in ks),
                                  sum(k.bytes * k.count for k in ks), sum(k.count for k in ks),
                                  max(by_bound, key=by_bound.get) if by_bound else ""))
        return tuple(out)

    def top(self, n: int = 15) -> tuple[Kernel, ...]:
        return tuple(sorted(self.kernels, key=lambda k: -k.total_seconds)[:n])

    @property
    def dtype_class(self) -> str | None:
        """The dtype class most of the program's matmul FLOPs run in (what its MFU is measured against)."""
        by: dict[str, float] = {}
        for k in self.kernels:
            if k.dtype_class:
                by[k.dtype_class] = by.get(k.dtype_class, 0.0) + k.flops * k.count
        return max(by, key=by.get) if by else None

    def split(self, by: str) -> dict[str, float]:
        """Predicted seconds by a kernel attribute ("phase", "component", "group", "bound"), largest first."""
        out: dict[str, float] = {}
        for k in self.kernels:
            out[getattr(k, by)] = out.get(getattr(k, by), 0.0) + k.total_seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def mfu(self, model_flops: float, peak_flops: float) -> float:
        """Model FLOPs of one run over the predicted time at the device's dense peak."""
        return model_flops / (self.seconds * peak_flops)

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "flops": self.flops, "bytes": self.bytes, "notes": list(self.notes),
                "groups": [asdict(g) for g in self.groups()], "kernels": [asdict(k) for k in self.kernels]}


# --------------------------------------------------------------------------- the program's kernels, priced


def _kind(ins: Instr) -> str:
    if ins.opcode == "custom-call":
        return ins.attr("custom_call_target") or "custom-call"
    if ins.opcode == "fusion":
        return ins.config.get("fusion_backend_config", {}).get("kind") or ins.attr("kind") or "fusion"
    return ins.opcode


def _frame(module: Module, ins: Instr) -> int | None:
    """The instruction's stack frame, or its fused root's (fusions of data movement often carry none)."""
    if ins.frame is None and ins.opcode == "fusion":
        return module.computations[ins.attr("calls").lstrip("%")].root.frame
    return ins.frame


def _source_group(chain: list[tuple[str, str, int]], op_name: str) -> str | None:
    """The group the innermost frame that names one says, looking no further out than the model's own code (a
    feed-forward kernel of a model the loss function calls is no loss kernel)."""
    for f, fn, _ in chain:
        where = f"{f}:{fn}"
        group = next((g for g, rule in SOURCE_GROUPS if rule.search(where)), None)
        if group or f.startswith("jaxlm/nn/"):
            return group
    return next((g for g, rule in SOURCE_GROUPS if rule.search(op_name)), None)


def _group(module: Module, ins: Instr, cost: Cost, chain: list[tuple[str, str, int]]) -> str:
    """collectives > attention (cuDNN, or a kernel of jaxlm's attention) > matmul > copies > by source."""
    if cost.link_bytes is not None:
        return "collectives"
    by_source = _source_group(chain, ins.op_name)
    if by_source == "attention" or _kind(ins).startswith("__cudnn$fmha"):
        return "attention"
    if cost.flops:
        return "matmul"
    moves = ins.opcode in ("copy", "copy-start", "transpose") or (
        ins.opcode == "fusion" and all(i.opcode in _MOVES for i in module.computations[
            ins.attr("calls").lstrip("%")].instrs.values()))
    return "copies" if moves else by_source or "other elementwise"


def _phase(module: Module, ins: Instr, group: str, chain: list[tuple[str, str, int]]) -> str:
    if group == "optimizer update":
        return "optimizer"
    if "rematted_computation" in ins.op_name:
        return "recompute"
    if "transpose(" in ins.op_name:
        return "backward"
    return "forward" if "jvp(" in ins.op_name or any(f.startswith("jaxlm/nn/") for f, _, _ in chain) else "other"


def _component(kind: str, flops: float, chain: list[tuple[str, str, int]]) -> str:
    where = [kind] + [f"matmul@{f}:{fn}" if flops else f"{f}:{fn}" for f, fn, _ in chain[:1]]
    where += [f"{f}:{fn}" for f, fn, _ in chain]
    return next((name for name, rule in COMPONENTS for w in where if rule.search(w)), "other")


def _compute(cost: Cost, rates: DeviceRates) -> tuple[float, float, str | None]:
    """(seconds of compute, extra bytes, shape class) of a kernel's GEMMs, attention calls and other matmuls."""
    missing = [c for c in cost.flops if c not in rates.matmul_flops]
    if missing:
        raise ValueError(f"DeviceRates.matmul_flops has no rate for dtype class {missing[0]!r}")
    seconds, extra, classes = 0.0, 0.0, {}
    for g in cost.gemms:
        t, more, cls = efficiency.gemm(g, rates.matmul_flops[g.cls], rates.sms)
        seconds, extra, classes[cls] = seconds + t, extra + more, classes.get(cls, 0.0) + t
    for a in cost.attention:
        t, cls = efficiency.attention(a, rates.matmul_flops[a.cls], rates.exp_rate, rates.sms)
        seconds, classes[cls] = seconds + t, classes.get(cls, 0.0) + t
    shaped = {c: sum(w.flops for w in (*cost.gemms, *cost.attention) if w.cls == c) for c in cost.flops}
    seconds += sum(max(0.0, f - shaped[c]) / rates.matmul_flops[c] for c, f in cost.flops.items())  # convolutions
    return seconds, extra, max(classes, key=classes.get) if classes else None


def _price(cost: Cost, rates: DeviceRates) -> tuple[float, str, str | None]:
    """(seconds, bound, shape class) of one kernel."""
    if cost.link_bytes is not None:
        if cost.link_bytes and not rates.link_bandwidth:
            raise ValueError("the program has collectives: DeviceRates.link_bandwidth must be set")
        return (cost.link_bytes / rates.link_bandwidth if cost.link_bytes else 0.0) + rates.launch_seconds, "link", \
            None
    if cost.host_bytes:
        if not rates.host_bandwidth:
            raise ValueError("the program copies to or from host memory: DeviceRates.host_bandwidth must be set")
        return cost.host_bytes / rates.host_bandwidth + rates.launch_seconds, "host", None
    compute, extra, cls = _compute(cost, rates)
    memory = (cost.bytes + extra) / rates.memory_bandwidth
    bound = "launch" if rates.launch_seconds >= max(compute, memory) else "compute" if compute > memory else "memory"
    return max(compute, memory) + rates.launch_seconds, bound, cls


def _kernel(module: Module, comp: Computation, ins: Instr, rates: DeviceRates, count: int) -> Kernel:
    cost = kernel_cost(module, comp, ins)
    chain = module.chain(_frame(module, ins))
    seconds, bound, shape = _price(cost, rates)
    source = f"{chain[0][0]}:{chain[0][2]} {chain[0][1]}" if chain else ""
    cls = max(cost.flops, key=cost.flops.get) if cost.flops else None
    group, flops = _group(module, ins, cost, chain), sum(cost.flops.values())
    return Kernel(ins.name, _kind(ins), group, ins.op_name, source, _phase(module, ins, group, chain),
                  _component(_kind(ins), flops, chain), flops, cost.bytes, cls, seconds, bound, count, shape)


def _walk(module: Module, name: str, rates: DeviceRates, count: int, notes: list[str]) -> list[Kernel]:
    """The kernels computation `name` launches when it runs `count` times."""
    comp, out = module.computations[name], []
    for ins in comp.instrs.values():
        op = ins.opcode
        if op in _FREE or op.endswith("-done"):
            continue
        if op == "while":
            trips = ins.config.get("known_trip_count", {}).get("n")
            if trips is None:
                notes.append(f"{ins.name}: a loop of unknown trip count, counted once")
            out += _walk(module, ins.attr("body").lstrip("%"), rates, count * int(trips or 1), notes)
        elif op == "conditional":
            branches = [_walk(module, b, rates, count, notes) for b in ins.callees]
            notes.append(f"{ins.name}: a conditional, its costliest of {len(branches)} branches counted")
            out += max(branches, key=lambda ks: sum(k.total_seconds for k in ks))
        elif op in ("call", "async-start"):
            out += _walk(module, ins.callees[0], rates, count, notes)
        else:
            out.append(_kernel(module, comp, ins, rates, count))
    return out


def predict(text: str | Module, rates: DeviceRates, calibration=None) -> Prediction:
    """The predicted run of an optimised HLO module (`compiled.as_text()`), kernel by kernel; `calibration`
    (jaxlm.predict.calibration.Calibration) scales each kernel by measured over predicted for its kind."""
    module = hlo.parse_module(text) if isinstance(text, str) else text
    notes: list[str] = []
    kernels = tuple(_walk(module, module.entry, rates, 1, notes))
    if calibration is None:
        return Prediction(kernels, tuple(notes))
    kernels = tuple(replace(k, seconds=k.seconds * calibration.factor(k.group, k.shape_class)) for k in kernels)
    return Prediction(kernels, tuple(notes), calibration.label)


def summary(p: Prediction, top: int = 15) -> dict:
    """The prediction in JSON-ready figures (milliseconds): what compiled rows keep and `python -m jaxlm.bench ops
    --target` prints: the groups (GROUPS, shares summing to 1), the passes and model parts, the `top` kernels, and
    the `top` ops (one op's kernels summed over the layers and launches, as a profiler's kernel summary sums
    the launches of one kernel)."""
    total = p.seconds or 1.0

    def kernel(k: Kernel) -> dict:
        return {"kernel": k.name, "kind": k.kind, "group": k.group, "component": k.component, "phase": k.phase,
                "op": _op(k), "source": k.source, "predicted_ms": 1e3 * k.total_seconds,
                "share": k.total_seconds / total, "flops": k.flops * k.count, "bytes": k.bytes * k.count,
                "bound": k.bound, "count": k.count, "shape_class": k.shape_class}

    ops: dict[tuple, dict] = {}  # the same op of every layer, as a profiler sums the launches of one kernel
    for k in p.kernels:
        o = ops.setdefault((k.group, k.component, k.phase, _op(k), k.source), {
            "op": _op(k), "source": k.source, "group": k.group, "component": k.component, "phase": k.phase,
            "launches": 0, "predicted_ms": 0.0, "share": 0.0, "flops": 0.0})
        o["launches"] += k.count
        o["predicted_ms"] += 1e3 * k.total_seconds
        o["share"] += k.total_seconds / total
        o["flops"] += k.flops * k.count

    return {"predicted_ms": 1e3 * p.seconds, "flops": p.flops, "bytes": p.bytes, "dtype_class": p.dtype_class,
            "matmul_precision": MATMUL_PRECISION.get(p.dtype_class or ""), "calibration": p.calibration,
            "notes": list(p.notes),
            "groups": [{"group": g.group, "predicted_ms": 1e3 * g.seconds, "share": g.share, "flops": g.flops,
                        "bytes": g.bytes, "bound": g.bound, "launches": g.launches} for g in p.groups()],
            "phases": {k: 1e3 * v for k, v in p.split("phase").items()},
            "components": {k: 1e3 * v for k, v in p.split("component").items()},
            "top": [kernel(k) for k in p.top(top)],
            "ops": sorted(ops.values(), key=lambda o: -o["predicted_ms"])[:top]}


def _op(k: Kernel) -> str:
    """The kernel's jax op name without the jit(...) every op of the step starts with; a library call (cuDNN's
    fused attention) led by its custom-call name, a kernel without an op by its own name."""
    op = re.sub(r"^jit\([^)]*\)/", "", k.op_name)
    if k.kind.startswith("__cudnn"):
        return f"{k.kind} {op}".strip()
    return op or k.name
