"""Static facts of an optimised HLO module: its matmuls by operand dtypes, cuDNN attention calls, collectives."""

from __future__ import annotations

import collections
import re

from jaxlm.predict import hlo
from jaxlm.predict.cost import COLLECTIVES, MATMUL_PRECISION, gemm_of
from jaxlm.predict.hlo import Module


def _module(program: str | Module) -> Module:
    return hlo.parse_module(program) if isinstance(program, str) else program


def program_facts(program: str | Module) -> dict:
    """Static counts in an optimised HLO module (or its text): matmuls (XLA dots, inside fusions too, and cuBLAS
    calls) by operand dtypes ("bf16xbf16") and the precision most of their FLOPs run at ("TF32": float32 at JAX's
    default precision), cuDNN attention calls by kind, and the instructions XLA's own rematerialisation pass cloned
    to fit the memory limit (it names them `NAME.remat`, `NAME.remat2`; not jaxlm's `compute.remat`, whose
    recomputation is traced into the program). An op inside a loop body counts once."""
    module = _module(program)
    matmuls, cudnn, flops, remat = collections.Counter(), collections.Counter(), collections.Counter(), 0
    for comp in module.computations.values():
        for ins in comp.instrs.values():
            remat += bool(re.search(r"\.remat\d*$", ins.name))
            target = ins.attr("custom_call_target") or "" if ins.opcode == "custom-call" else ""
            if target.startswith("__cudnn$fmha"):
                cudnn[target.removeprefix("__cudnn$")] += 1
            if (g := gemm_of(comp, ins)) is not None:
                types = [comp.instrs[o].shape[0].dtype if o in comp.instrs else "?" for o in ins.operands[:2]]
                matmuls["x".join(types)] += 1
                flops[g.cls] += g.flops
    cls = max(flops, key=flops.get) if flops else None
    return {"matmuls": sum(matmuls.values()), "matmul_dtypes": dict(sorted(matmuls.items())),
            "matmul_precision": MATMUL_PRECISION.get(cls) if cls else None,
            "cudnn_attention_calls": sum(cudnn.values()), "cudnn_calls": dict(sorted(cudnn.items())),
            "rematerialised": remat}


def collectives(program: str | Module) -> dict[str, dict[str, int]]:
    """op -> {"count", "bytes"} for every collective of jaxlm.predict.cost.COLLECTIVES, over an optimised HLO
    module's instructions (their result shapes; tuples summed; an async pair counted at its start). A static count:
    an op inside a loop body (the scanned layers) counts once."""
    module = _module(program)
    out = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
    for comp in module.computations.values():
        for ins in comp.instrs.values():
            op = ins.opcode.removesuffix("-start")
            if op in out:
                out[op]["count"] += 1
                out[op]["bytes"] += int(hlo.nbytes(ins.shape))
    return out
