"""What one kernel of an optimised HLO module does: matmul FLOPs by dtype class and the shapes they run in (GEMMs,
fused attention), bytes read and written, bytes over the links (collectives) and over the host link (offloaded
buffers). How those are priced: jaxlm.predict.roofline and jaxlm.predict.efficiency.

In-place updates. XLA runs a dynamic-update-slice or a scatter in the buffer of its operand (copy insertion
makes every such pair, and a fusion whose root updates one of its parameters, share one buffer: HLO dataflow
analysis's in-place input/output pairs), and where the operand is still needed it inserts an explicit `copy`,
which is a kernel of its own here. So an update costs what it touches: its updates (and a scatter-add reads
the positions it adds to), never its whole operand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxlm.predict import hlo
from jaxlm.predict.hlo import Computation, Instr, Module

# The words a matmul's dtype class is printed with ("float32 (TF32 matmuls)").
MATMUL_PRECISION = {"bf16": "bfloat16", "tf32": "TF32", "fp32": "FP32", "fp8": "FP8", "int8": "int8", "fp64": "FP64"}
# Each collective and the bytes each GPU sends over its links per byte of its operands, in a group of n GPUs
# (ring algorithms: an all-reduce sends 2 (n - 1) / n; point-to-point kinds send their operands once). The one
# table of collectives: jaxlm.predict.program counts the same ops.
COLLECTIVES = {
    "all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: n - 1, "reduce-scatter": lambda n: (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / n, "ragged-all-to-all": lambda n: (n - 1) / n,
    "collective-permute": lambda n: 1.0, "collective-broadcast": lambda n: 1.0, "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}


@dataclass(frozen=True)
class Gemm:
    """One matrix product: `batch` independent (m x k) @ (k x n) products in dtype class `cls`, `passes` times."""

    batch: int
    m: int
    n: int
    k: int
    cls: str
    passes: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k * self.passes


@dataclass(frozen=True)
class Attention:
    """One fused attention call (cuDNN): `batch` x `heads` of (q_len x k_len) scores, head dims `d` (q, k) and `dv`."""

    batch: int
    heads: int
    q_len: int
    k_len: int
    d: int
    dv: int
    causal: bool
    window: int  # keys a query sees, itself included (0: no window)
    backward: bool
    cls: str

    @property
    def per_pair(self) -> int:
        """Matmul FLOPs per (query, key) pair: forward Q K^T and P V; backward 5 (the scores again, 4 gradients)."""
        return 2 * (3 * self.d + 2 * self.dv) if self.backward else 2 * (self.d + self.dv)

    @property
    def flops(self) -> float:
        return float(self.batch * self.heads * visible_pairs(self.q_len, self.k_len, self.causal, self.window)
                     * self.per_pair)


@dataclass(frozen=True)
class Cost:
    flops: dict[str, float]  # matmul FLOPs by dtype class
    bytes: float  # device memory read + written
    link_bytes: float | None = None  # a collective's bytes over the link
    host_bytes: float = 0.0  # bytes copied between device and host memory (remat offload)
    gemms: tuple[Gemm, ...] = ()
    attention: tuple[Attention, ...] = ()


def dtype_class(dtypes: tuple[str, ...], precision: str | None = None, algorithm: str | None = None
                ) -> tuple[str, int]:
    """(class, passes) of a matmul from its operand dtypes, `operand_precision` and `algorithm` fields."""
    if algorithm and algorithm.lower() not in ("alg_unset", "unset"):
        alg = algorithm.lower().removeprefix("alg_").removeprefix("dot_")
        passes = re.search(r"_x(\d+)$", alg)
        first = alg.split("_")[0 if not alg.startswith("any") else 1]
        cls = {"bf16": "bf16", "f16": "bf16", "tf32": "tf32", "f32": "fp32", "f64": "fp64"}.get(first, "fp8")
        return cls, int(passes.group(1)) if passes else 1
    if "f64" in dtypes:
        return "fp64", 1
    if "f32" in dtypes:
        return ("fp32" if precision and "highest" in precision.lower() else "tf32"), 1
    if {"bf16", "f16"} & set(dtypes):
        return "bf16", 1
    if any(d.startswith("f8") for d in dtypes):
        return "fp8", 1
    return "int8", 1


def _type(comp: Computation, name: str) -> tuple[hlo.Array, ...]:
    return comp.instrs[name].shape if name in comp.instrs else ()


def _prod(dims: tuple[int, ...], picked: list[int]) -> int:
    out = 1
    for d in picked:
        out *= dims[d]
    return out


def _gemm(lhs: hlo.Array, rhs: hlo.Array, dims: dict[str, list], cls: str, passes: int) -> Gemm:
    """A dot's GEMM from its operands and dimension numbers (lists under lhs_/rhs_ batch/contracting keys)."""
    lb, lc, rb, rc = ([int(x) for x in dims.get(k, [])] for k in ("lhs_batch", "lhs_contracting", "rhs_batch",
                                                                   "rhs_contracting"))
    m = _prod(lhs.dims, [d for d in range(len(lhs.dims)) if d not in lb + lc])
    n = _prod(rhs.dims, [d for d in range(len(rhs.dims)) if d not in rb + rc])
    return Gemm(_prod(lhs.dims, lb), m, n, _prod(lhs.dims, lc), cls, passes)


def _dot(comp: Computation, ins: Instr) -> Gemm:
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    cls, passes = dtype_class((lhs.dtype, rhs.dtype), ins.attr("operand_precision"), ins.attr("algorithm"))
    dims = {k: ins.ints(f"{k}_dims") for k in ("lhs_batch", "lhs_contracting", "rhs_batch", "rhs_contracting")}
    return _gemm(lhs, rhs, dims, cls, passes)


def _cublas(comp: Computation, ins: Instr) -> Gemm:
    cfg = ins.config.get("gemm_backend_config", {})
    numbers = cfg.get("dot_dimension_numbers", {})
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    precision = cfg.get("precision_config", {})
    cls, passes = dtype_class((lhs.dtype, rhs.dtype), " ".join(precision.get("operand_precision", [])),
                              precision.get("algorithm"))
    dims = {k: numbers.get(f"{k}_dimensions", []) for k in ("lhs_batch", "lhs_contracting", "rhs_batch",
                                                            "rhs_contracting")}
    return _gemm(lhs, rhs, dims, cls, passes)


def gemm_of(comp: Computation, ins: Instr) -> Gemm | None:
    """The GEMM of a dot or a cuBLAS call, None for anything else."""
    if ins.opcode == "dot":
        return _dot(comp, ins)
    if ins.opcode == "custom-call" and (ins.attr("custom_call_target") or "").startswith("__cublas"):
        return _cublas(comp, ins)
    return None


def _convolution(comp: Computation, ins: Instr) -> dict[str, float]:
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    labels = (ins.attr("dim_labels") or "_io->").split("_")[1].split("->")[0]
    per_output = rhs.elements / rhs.dims[labels.index("o")]  # multiply-adds per output element
    cls, _ = dtype_class((lhs.dtype, rhs.dtype), ins.attr("operand_precision"))
    return {cls: 2.0 * ins.shape[0].elements * per_output}


def visible_pairs(q_len: int, k_len: int, causal: bool, window: int = 0) -> int:
    """(query, key) pairs attention computes: query i sees keys 0..i (causal), at most `window` of them
    (cuDNN's sliding_window_length, the query included; 0: no window)."""
    if not causal:
        return q_len * k_len
    c = min(k_len, window or k_len)
    return q_len * (q_len + 1) // 2 if q_len <= c else c * (c + 1) // 2 + (q_len - c) * c


def _fmha(comp: Computation, ins: Instr, target: str) -> Attention | None:
    cfg = ins.config.get("cudnn_fmha_backend_config", {})
    shape = cfg.get("intermediate_tensor_shape", {}).get("dimensions")
    if not shape:
        return None
    b, n, tq, tk = (int(x) for x in shape)
    q, k, v = (_type(comp, o)[0] for o in ins.operands[:3])
    d = q.elements // (b * n * tq)
    return Attention(b, n, tq, tk, d, d * v.elements // k.elements, "CAUSAL" in str(cfg.get("mask_type", "")),
                     int(cfg.get("sliding_window_length", 0)), "Backward" in target, dtype_class((q.dtype,))[0])


def _work(module: Module, comp: Computation, ins: Instr) -> tuple[list[Gemm], list[Attention], dict[str, float]]:
    """The GEMMs, attention calls and other matmul FLOPs (convolutions) of one instruction, or of everything a
    fusion/call runs."""
    if (g := gemm_of(comp, ins)) is not None:
        return [g], [], {}
    if ins.opcode == "convolution":
        return [], [], _convolution(comp, ins)
    if ins.opcode == "custom-call":
        target = ins.attr("custom_call_target") or ""
        fmha = _fmha(comp, ins, target) if target.startswith("__cudnn$fmha") else None
        return [], [fmha] if fmha else [], {}
    gemms, attention, other = [], [], {}
    for callee in ins.callees if ins.opcode in ("fusion", "call") else ():
        inner = module.computations[callee]
        for sub in inner.instrs.values():
            g, a, o = _work(module, inner, sub)
            gemms, attention = gemms + g, attention + a
            for cls, f in o.items():
                other[cls] = other.get(cls, 0.0) + f
    return gemms, attention, other


def _through_bitcasts(comp: Computation, name: str) -> Instr | None:
    ins = comp.instrs.get(name)
    while ins is not None and ins.opcode == "bitcast":
        ins = comp.instrs.get(ins.operands[0])
    return ins


def _updates(comp: Computation, ins: Instr) -> tuple[hlo.Array, ...] | None:
    """What an in-place update writes (a dynamic-update-slice's update, a scatter's updates), or None when `ins`
    is no update of a fusion parameter (a scatter into a buffer built inside the fusion writes all of it)."""
    if ins.opcode not in ("dynamic-update-slice", "scatter"):
        return None
    base = _through_bitcasts(comp, ins.operands[0])
    if base is None or base.opcode != "parameter":
        return None
    updates = ins.operands[1] if ins.opcode == "dynamic-update-slice" else ins.operands[-1]
    return tuple(hlo.Array(ins.shape[0].dtype, a.dims) for a in _type(comp, updates))


_PASS_THROUGH = {"bitcast", "reshape", "convert", "copy"}  # one element in, one out: a fusion computes them per element


def _read(comp: Computation, name: str, full: float) -> float:
    """Bytes a fusion reads of parameter `name`: a slice / gather of it (or of its bitcast, reshape or dtype
    conversion) reads only what it takes, an in-place update of it nothing (a scatter: the positions it updates,
    which a scatter-add reads)."""
    total = 0.0
    for user in comp.users.get(name, []):
        if user.opcode in _PASS_THROUGH:  # a slice of its result reads only the sliced elements of the parameter
            total += _read(comp, user.name, full)
        elif user.opcode in ("dynamic-slice", "slice", "gather") and user.operands[0] == name:
            total += hlo.nbytes(user.shape)
        elif user.operands[0] == name and (updates := _updates(comp, user)) is not None:
            total += hlo.nbytes(updates) if user.opcode == "scatter" else 0.0
        else:
            return full
    return min(total, full)


def _written(comp: Computation, ins: Instr) -> float:
    if ins.opcode == "tuple":
        return sum(_written(comp, comp.instrs[o]) for o in ins.operands)
    if ins.opcode == "bitcast" and (inner := _through_bitcasts(comp, ins.name)) is not None:
        ins = inner
    updates = _updates(comp, ins)
    return hlo.nbytes(updates) if updates is not None else hlo.nbytes(ins.shape)


def _bytes(module: Module, comp: Computation, ins: Instr) -> float:
    if ins.opcode == "fusion":
        fused = module.computations[ins.attr("calls").lstrip("%")]
        reads = sum(_read(fused, p.name, hlo.nbytes(_type(comp, o))) for p, o in zip(fused.parameters(), ins.operands))
        return reads + _written(fused, fused.root)
    if ins.opcode in ("dynamic-update-slice", "scatter"):  # unfused, in place: the updates read and written
        updates = hlo.nbytes(_type(comp, ins.operands[1 if ins.opcode == "dynamic-update-slice" else -1]))
        indices = sum(hlo.nbytes(_type(comp, o)) for o in ins.operands[1:-1]) if ins.opcode == "scatter" else 0.0
        return 2 * updates + indices + (updates if ins.opcode == "scatter" else 0.0)
    if ins.opcode in ("dynamic-slice", "slice", "gather"):
        return 2 * hlo.nbytes(ins.shape)
    if ins.opcode == "copy-start":  # its result is (destination, source, context): one array read and written
        return 2 * hlo.nbytes(_type(comp, ins.operands[0])[:1])
    result = ins.shape
    if ins.opcode == "custom-call" and len(result) > 1 and result[-1].dtype in ("u8", "s8"):
        result = result[:-1]  # the library's workspace
    return sum(hlo.nbytes(_type(comp, o)) for o in ins.operands) + hlo.nbytes(result)


def host_copy_bytes(comp: Computation, ins: Instr) -> float:
    """Bytes a copy moves between host and device memory (a `copy-start` or `copy` with one side in the host's
    memory space, as remat offload compiles); 0 for anything else."""
    if ins.opcode not in ("copy-start", "copy") or not ins.operands:
        return 0.0
    source = _type(comp, ins.operands[0])
    if any(a.on_host for a in ins.shape[:1] + source[:1]):
        return hlo.nbytes(source[:1])
    return 0.0


def group_size(ins: Instr, default: int) -> int:
    """GPUs in each of a collective's groups, from `replica_groups` in any of its three spellings."""
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", ins.attrs)
    if mesh:
        sizes = dict(re.findall(r"'?(\w+)'?=(\d+)", mesh.group(1)))
        n = 1
        for axis in re.findall(r"'?(\w+)'?", mesh.group(2)):
            n *= int(sizes.get(axis, 1))
        return n
    groups = ins.attr("replica_groups") or ""
    if groups.startswith("["):  # [groups, size]<=[devices]
        return int(re.findall(r"\d+", groups)[-1])
    first = re.match(r"\{\{([^}]*)\}", groups)
    return len(re.findall(r"\d+", first.group(1))) if first else default


def _collective(module: Module, comp: Computation, ins: Instr, kind: str) -> Cost:
    n = group_size(ins, module.partitions)
    sent = sum(hlo.nbytes(_type(comp, o)) for o in ins.operands)
    return Cost({}, sent + hlo.nbytes(ins.shape[-1:]), COLLECTIVES[kind](n) * sent)


def kernel_cost(module: Module, comp: Computation, ins: Instr) -> Cost:
    """The cost of kernel `ins` of computation `comp` (a fusion, library call, collective, copy or unfused op)."""
    kind = ins.opcode.removesuffix("-start")
    if kind in COLLECTIVES:
        return _collective(module, comp, ins, kind)
    host = host_copy_bytes(comp, ins)
    if host:
        return Cost({}, 0.0, host_bytes=host)
    gemms, attention, flops = _work(module, comp, ins)
    for w in [*gemms, *attention]:
        flops[w.cls] = flops.get(w.cls, 0.0) + w.flops
    return Cost(flops, _bytes(module, comp, ins), gemms=tuple(gemms), attention=tuple(attention))
