"""What one kernel of an optimised HLO module does: matmul FLOPs by dtype class, bytes read and written, bytes
over the link (collectives). The assumptions are jaxlm.analysis.roofline's (its docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxlm.analysis import hlo
from jaxlm.analysis.hlo import Computation, Instr, Module

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute",
               "collective-broadcast", "send", "recv"}


@dataclass(frozen=True)
class Cost:
    flops: dict[str, float]  # by dtype class
    bytes: float
    link_bytes: float | None = None  # a collective's bytes over the link


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


def _dot(comp: Computation, ins: Instr) -> dict[str, float]:
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    k = 1
    for d in ins.ints("lhs_contracting_dims"):
        k *= lhs.dims[d]
    cls, passes = dtype_class((lhs.dtype, rhs.dtype), ins.attr("operand_precision"), ins.attr("algorithm"))
    return {cls: 2.0 * ins.shape[0].elements * k * passes}


def _convolution(comp: Computation, ins: Instr) -> dict[str, float]:
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    labels = (ins.attr("dim_labels") or "_io->").split("_")[1].split("->")[0]
    per_output = rhs.elements / rhs.dims[labels.index("o")]  # multiply-adds per output element
    cls, _ = dtype_class((lhs.dtype, rhs.dtype), ins.attr("operand_precision"))
    return {cls: 2.0 * ins.shape[0].elements * per_output}


def _cublas(comp: Computation, ins: Instr) -> dict[str, float]:
    cfg = ins.config.get("gemm_backend_config", {})
    dims = cfg.get("dot_dimension_numbers", {})
    lhs, rhs = (_type(comp, o)[0] for o in ins.operands[:2])
    k = 1
    for d in dims.get("lhs_contracting_dimensions", []):
        k *= lhs.dims[int(d)]
    precision = cfg.get("precision_config", {})
    cls, passes = dtype_class((lhs.dtype, rhs.dtype), " ".join(precision.get("operand_precision", [])),
                              precision.get("algorithm"))
    return {cls: 2.0 * ins.shape[0].elements * k * passes}


def visible_pairs(q_len: int, k_len: int, causal: bool, window: int = 0) -> int:
    """(query, key) pairs attention computes: query i sees keys 0..i (causal), at most `window` of them
    (cuDNN's sliding_window_length, the query included; 0: no window)."""
    if not causal:
        return q_len * k_len
    c = min(k_len, window or k_len)
    return q_len * (q_len + 1) // 2 if q_len <= c else c * (c + 1) // 2 + (q_len - c) * c


def _fmha(comp: Computation, ins: Instr, target: str) -> dict[str, float]:
    cfg = ins.config.get("cudnn_fmha_backend_config", {})
    shape = cfg.get("intermediate_tensor_shape", {}).get("dimensions")
    if not shape:
        return {}
    b, n, tq, tk = (int(x) for x in shape)
    q, k, v = (_type(comp, o)[0] for o in ins.operands[:3])
    d = q.elements // (b * n * tq)
    dv = d * v.elements // k.elements
    pairs = visible_pairs(tq, tk, "CAUSAL" in str(cfg.get("mask_type", "")), int(cfg.get("sliding_window_length", 0)))
    per_pair = 2 * (3 * d + 2 * dv) if "Backward" in target else 2 * (d + dv)
    return {dtype_class((q.dtype,))[0]: float(b * n * pairs * per_pair)}


def _flops(module: Module, comp: Computation, ins: Instr) -> dict[str, float]:
    """Matmul FLOPs by dtype class of one instruction, or of everything a fusion/call runs."""
    if ins.opcode == "dot":
        return _dot(comp, ins)
    if ins.opcode == "convolution":
        return _convolution(comp, ins)
    if ins.opcode == "custom-call":
        target = ins.attr("custom_call_target") or ""
        if target.startswith("__cublas"):
            return _cublas(comp, ins)
        return _fmha(comp, ins, target) if target.startswith("__cudnn$fmha") else {}
    out: dict[str, float] = {}
    for callee in ins.callees if ins.opcode in ("fusion", "call") else ():
        inner = module.computations[callee]
        for sub in inner.instrs.values():
            for cls, f in _flops(module, inner, sub).items():
                out[cls] = out.get(cls, 0.0) + f
    return out


def _read(comp: Computation, name: str, full: float) -> float:
    """Bytes a fusion reads of parameter `name`: a slice / gather of it reads only what it takes, an in-place
    update of it nothing."""
    total = 0.0
    for user in comp.users.get(name, []):
        if user.opcode == "bitcast":
            total += _read(comp, user.name, full)
        elif user.opcode in ("dynamic-slice", "slice", "gather") and user.operands[0] == name:
            total += hlo.nbytes(user.shape)
        elif not (user.opcode == "dynamic-update-slice" and user.operands[0] == name):
            return full
    return min(total, full)


def _written(comp: Computation, ins: Instr) -> float:
    if ins.opcode == "tuple":
        return sum(_written(comp, comp.instrs[o]) for o in ins.operands)
    if ins.opcode == "dynamic-update-slice":  # in place: only the update is written
        return hlo.nbytes(_type(comp, ins.operands[1]))
    return hlo.nbytes(ins.shape)


def _bytes(module: Module, comp: Computation, ins: Instr) -> float:
    if ins.opcode == "fusion":
        fused = module.computations[ins.attr("calls").lstrip("%")]
        reads = sum(_read(fused, p.name, hlo.nbytes(_type(comp, o))) for p, o in zip(fused.parameters(), ins.operands))
        return reads + _written(fused, fused.root)
    if ins.opcode == "dynamic-update-slice":
        return 2 * hlo.nbytes(_type(comp, ins.operands[1]))
    if ins.opcode in ("dynamic-slice", "slice", "gather"):
        return 2 * hlo.nbytes(ins.shape)
    result = ins.shape
    if ins.opcode == "custom-call" and len(result) > 1 and result[-1].dtype in ("u8", "s8"):
        result = result[:-1]  # the library's workspace
    return sum(hlo.nbytes(_type(comp, o)) for o in ins.operands) + hlo.nbytes(result)


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
    # per GPU, ring algorithms over n GPUs; point-to-point kinds send their operands once
    link = {"all-reduce": 2 * (n - 1) / n * sent, "all-gather": (n - 1) * sent,
            "reduce-scatter": (n - 1) / n * sent, "all-to-all": (n - 1) / n * sent,
            "ragged-all-to-all": (n - 1) / n * sent}.get(kind, sent)
    return Cost({}, sent + hlo.nbytes(ins.shape[-1:]), link)


def kernel_cost(module: Module, comp: Computation, ins: Instr) -> Cost:
    """The cost of kernel `ins` of computation `comp` (a fusion, library call, collective or unfused op)."""
    kind = ins.opcode.removesuffix("-start")
    if kind in COLLECTIVES:
        return _collective(module, comp, ins, kind)
    return Cost(_flops(module, comp, ins), _bytes(module, comp, ins))
