"""`--memory-profile DIR`: what holds memory in a forward pass and in a train step.

Writes, for mode in (forward, train_step):
- `jax_{mode}.prof`: `jax.profiler.save_device_memory_profile` (pprof; view with
  `pprof -http=: jax_train_step.prof` or upload to a pprof viewer). It records
  the buffers live at the moment it is called, i.e. right after the step with
  its outputs held, not the transient peak inside the step;
- `jax_{mode}_buffers.txt`: the compiled step's `memory_analysis()` (the
  temp bytes are the in-step transient peak) and the largest live arrays
  (`jax.live_arrays()` by size, with shape and dtype);
- what each plugged-in side asked for writes (`memory_snapshot`; parity's: an allocation
  history on a GPU, a note on the CPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax

from jaxlm.analysis.memory import compiled_memory
from jaxlm.bench import sides, steps
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.training.tracking import peak_memory_bytes


def _describe_analysis(compiled) -> list[str]:
    m = compiled_memory(compiled)
    if m is None:
        return ["memory_analysis unavailable on this backend"]
    rows = [("argument", m.argument), ("output", m.output), ("alias", m.alias), ("temp", m.temp),
            ("total (arg+out+temp-alias)", m.total)]
    return [f"  {name:32s} {value / 2**20:12.3f} MiB" for name, value in rows]


def _live_arrays(top: int) -> list[str]:
    arrays = sorted(jax.live_arrays(), key=lambda a: a.nbytes, reverse=True)
    total = sum(a.nbytes for a in arrays)
    lines = [f"live arrays: {len(arrays)}, {total / 2**20:.3f} MiB in all; the {min(top, len(arrays))} largest:"]
    for a in arrays[:top]:
        lines.append(f"  {a.nbytes / 2**20:10.3f} MiB  {str(a.dtype):9s} {tuple(a.shape)}")
    return lines


def memory_profile(cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, out_dir: str | Path, *,
                   other_sides: tuple[str, ...] = (), top: int = 25) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in ("forward", "train_step"):
        step = steps.build_step(mode, cfg, compute, batch, context)
        compiled = steps.compile_step(step)
        outputs = compiled(*step.args)
        jax.block_until_ready(outputs)
        prof = out / f"jax_{mode}.prof"
        try:
            jax.profiler.save_device_memory_profile(str(prof))
            written.append(prof)
        except Exception as e:  # keep the text report even if pprof output fails
            (out / f"jax_{mode}.prof.error.txt").write_text(f"save_device_memory_profile failed: {e}\n")
        lines = [f"{mode}: {dataclasses.asdict(cfg)} {dataclasses.asdict(compute)}",
                 f"batch {batch}, context {context}, device {steps.device_kind()}",
                 "", "compiled memory_analysis():"] + _describe_analysis(compiled)
        peak = peak_memory_bytes()
        lines.append(f"  runtime peak_bytes_in_use (process): {peak / 2**20:.3f} MiB" if peak is not None
                     else "  runtime peak: not available on this backend")
        lines += ["", *_live_arrays(top)]
        txt = out / f"jax_{mode}_buffers.txt"
        txt.write_text("\n".join(lines) + "\n")
        written.append(txt)
        del outputs, step, compiled
    for name in other_sides:  # plugged-in sides (jaxlm.bench.sides) write their own
        written.append(sides.load(name).memory_snapshot(cfg, compute, batch, context, out))
    return written
