"""CSE599-O part 2's memory_profiling for `large` compiled for a GPU (docs/results/compiled/large-memory-profile.*,
answered in docs/report/answers.md): peak memory, the largest buffers with the op and source line that make them,
and live bytes over the compiled schedule, read from XLA's dump of its buffer assignment and live ranges."""

from __future__ import annotations

import itertools
import re
import sys
import tempfile
from pathlib import Path

from deliverables.common import render, table
from deliverables.compiled_memory import GIB, OUT_DIR, job
from jaxlm import cli
from jaxlm.analysis.memory import compiled_memory
from jaxlm.core.files import read_json, write_json
from jaxlm.predict import compile as gpu
from jaxlm.predict import hlo
from jaxlm.predict.store import job_config
from jaxlm.predict.target import Target, parse_target, require_compiler

PRESET, BATCH, CONTEXTS = "large", 4, (128, 256, 512)
MODES, DTYPES = ("forward", "train_step"), ("float32", "bfloat16")
POINTS = 400  # timeline points kept per step (each the largest live figure of its stretch of the schedule)
MIB = 2**20
_PLUMBING = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant")  # define no work of a phase
_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(?:, ([\w-]+))?")  # its kind: parameter, ...-temp
_VALUE = re.compile(r"^ value: <\d+ ([^ >]+) @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")
_RANGE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)$", re.M)
_POSITION = re.compile(r"^\s+(\d+):(\S+)$", re.M)


def label(mode: str, dtype: str, context: int) -> str:
    return f"{mode}, {dtype}, context {context}"


def rows() -> list[tuple[str, dict]]:
    return [(label(m, d, t), job(PRESET, t, BATCH, d, mode=m)) for m in MODES for d in DTYPES for t in CONTEXTS]


def values(assignment: str) -> dict[str, tuple[tuple[int, int], int, str, str]]:
    """value -> ((allocation, offset), bytes, shape, kind of its allocation) from a buffer-assignment dump."""
    out, alloc, kind = {}, None, ""
    for line in assignment.splitlines():
        if m := _ALLOCATION.match(line):
            alloc, kind = int(m.group(1)), m.group(3) or ""
        elif (m := _VALUE.match(line)) and alloc is not None:
            name = m.group(1)  # keyed as the live-range dump names it: `fusion.3{}`, a tuple's element `fusion.3{1}`
            out[name if "{" in name else name + "{}"] = ((alloc, int(m.group(3))), int(m.group(2)),
                                                          m.group(4).split("{")[0], kind)
    return out


def schedule(live_range: str) -> tuple[list[str], list[tuple[str, int, int]]]:
    """(the instructions in schedule order, (value, first position, last position) each) of a live-range dump."""
    head, _, rest = live_range.partition("BufferLiveRange:")
    ranges = rest.split("Live ranges at", 1)[0]
    order = [name for _, name in sorted((int(i), n) for i, n in _POSITION.findall(head))]
    return order, [(v, int(a), int(b)) for v, a, b in _RANGE.findall(ranges)]


def timeline(assignment: str, live_range: str) -> list[int]:
    """Bytes live at each position of the schedule: every value from its definition to its last use, both ends
    included (a kernel holds its inputs and its output at once); values that share a slot of an allocation (an
    in-place update) count once."""
    slots = values(assignment)
    order, ranges = schedule(live_range)
    by_slot: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for name, a, b in ranges:
        if name in slots:
            slot, size, _, _ = slots[name]
            by_slot.setdefault(slot, []).append((a, b, size))
    diff = [0] * (len(order) + 2)
    for spans in by_slot.values():
        spans.sort()
        a, b, size = spans[0]
        for a2, b2, size2 in spans[1:]:
            if a2 <= b:  # overlapping (or touching) uses of one slot: one buffer
                b, size = max(b, b2), max(size, size2)
                continue
            diff[a] += size
            diff[b + 1] -= size
            a, b, size = a2, b2, size2
        diff[a] += size
        diff[b + 1] -= size
    return list(itertools.accumulate(diff[:len(order)]))


def phase(ins: hlo.Instr | None) -> str | None:
    """What a scheduled instruction belongs to, from its op name: the forward (under jax's `jvp`), the backward
    (`transpose(jvp)`), or the update after them (gradient clipping and AdamW); None without metadata."""
    if ins is None or not ins.op_name or ins.opcode in _PLUMBING:
        return None
    return "backward" if "transpose(" in ins.op_name else "forward" if "jvp(" in ins.op_name else "update"


def _split(labels: list[str | None], before: str, after: str, start: int = 0) -> int:
    """The position from `start` on that best parts `before` from `after`: most of the one before it and of the
    other from it on (XLA interleaves a little: the gradient norm's sums run as the backward makes gradients)."""
    best, score, top = start, 0, 0
    for i in range(start, len(labels)):
        score += (labels[i] == before) - (labels[i] == after)
        if score > top:
            best, top = i + 1, score
    return best


def phases(order: list[str], module: hlo.Module, mode: str) -> dict[str, list[int]]:
    """phase -> [first, last] schedule position: forward, backward and update of a train step, where each
    phase's instructions are the majority; the eval step is all forward."""
    if mode != "train_step":
        return {"forward": [0, len(order) - 1]}
    entry = module.computations[module.entry].instrs
    labels = [phase(entry.get(name)) for name in order]
    back = _split(labels, "forward", "backward")
    update = _split(labels, "backward", "update", back)
    return {"forward": [0, back - 1], "backward": [back, update - 1], "update": [update, len(order) - 1]}


def _described(ins: hlo.Instr, module: hlo.Module) -> hlo.Instr:
    """The instruction, or for a fusion without metadata its fused root (a pad or copy the compiler made)."""
    if ins.frame is None and ins.opcode == "fusion" and ins.attr("calls"):
        return module.computations[ins.attr("calls").lstrip("%")].root
    return ins


def source(ins: hlo.Instr, module: hlo.Module) -> str:
    """The innermost line of jaxlm (else of any package) that made the instruction: `jaxlm/nn/layers.py:64 dense`;
    for an instruction the compiler made without a source, its opcode."""
    chain = module.chain(ins.frame)
    if not chain:
        return f"no source line (XLA's own {ins.opcode})"
    f, fn, line = next((c for c in chain if c[0].startswith("jaxlm/")), chain[0])
    return f"{f}:{line} {fn}"


def largest(assignment: str, module: hlo.Module, top: int = 8) -> list[dict]:
    """The largest values the step makes (not its parameters), equal ones grouped: bytes, shape, how many, the
    defining instruction's op name and source line."""
    entry = module.computations[module.entry].instrs
    groups: dict[tuple, dict] = {}
    for name, (_, size, shape, kind) in values(assignment).items():
        ins = entry.get(name.split("{")[0])
        if kind == "parameter" or ins is None or ins.opcode in ("parameter", "tuple", "get-tuple-element"):
            continue
        made = _described(ins, module)
        where = (size, shape, re.sub(r"^jit\([^)]*\)/", "", made.op_name) or made.opcode, source(made, module))
        g = groups.setdefault(where, {"bytes": size, "shape": shape, "op": where[2], "source": where[3],
                                      "count": 0, "example": ins.name})
        g["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["bytes"], -g["count"]))[:top]


def _thin(live: list[int], points: int = POINTS) -> list[int]:
    """The largest figure of each of `points` equal stretches of the schedule (the peak survives)."""
    n = len(live)
    return live if n <= points else [max(live[i * n // points:max((i + 1) * n // points, i * n // points + 1)])
                                     for i in range(points)]


def profile(j: dict, target: Target) -> dict:
    """One step compiled for `target` with the dump on: totals, the timeline, its phases and the largest values."""
    cfg, mode = job_config(j), j["mode"]
    with tempfile.TemporaryDirectory() as where:
        compiled, seconds, _ = gpu.compile_step(cfg, target, mode, options={"xla_dump_hlo_as_text": True,
                                                                               "xla_dump_to": where})
        assignment, live_range = (_dumped(Path(where), f) for f in ("buffer-assignment.txt", "live-range.txt"))
    module = hlo.parse_module(compiled.as_text())
    m = compiled_memory(compiled)
    live = timeline(assignment, live_range)
    order, _ = schedule(live_range)
    return {"argument_bytes": m.argument, "output_bytes": m.output, "alias_bytes": m.alias, "temp_bytes": m.temp,
            "total_bytes": m.total, "peak_live_bytes": max(live), "peak_position": live.index(max(live)),
            "instructions": len(order), "timeline": _thin(live), "phases": phases(order, module, mode),
            "largest": largest(assignment, module), "compile_s": seconds, "label": target.label}


def _dumped(where: Path, suffix: str) -> str:
    """The text of XLA's dump of the optimised module ending in `suffix` (one compile per folder)."""
    found = sorted(where.glob(f"*after_optimizations-{suffix}"))
    if not found:
        raise RuntimeError(f"XLA wrote no *after_optimizations-{suffix} under {where}")
    return found[-1].read_text()


def stored(out: Path = OUT_DIR) -> dict[str, dict]:
    """label -> the profiled figures kept in OUT/large-memory-profile.json (none compiled here)."""
    return (read_json(out / f"{PRESET}-memory-profile.json", default=None) or {}).get("rows") or {}


def page(figures: dict[str, dict], target: Target) -> str:
    """The Markdown page (deliverables/pages/memory_profile.md): peak memory by context, mode and dtype; live bytes;
    the largest values of each float32 step."""
    def gib(r: dict, key: str = "total_bytes") -> str:
        return f"{r[key] / GIB:.2f}" if r else "-"

    peak = table(["context", *(f"{m.replace('_', ' ')} {d}" for m in MODES for d in DTYPES)],
                 [[t, *(gib(figures.get(label(m, d, t), {})) for m in MODES for d in DTYPES)] for t in CONTEXTS], "lr")
    live = table(["step", "instructions", "peak live GiB", "at position", "compiled total GiB"],
                 [[lbl, f"{r['instructions']:,}", gib(r, "peak_live_bytes"), f"{r['peak_position']:,}", gib(r)]
                  for lbl, r in figures.items()], "lr")
    largest = [f"## The largest values: {lbl}\n\n" + table(
        ["instruction", "MiB", "shape", "count", "op", "source"],
        [[g["example"], f"{g['bytes'] / MIB:,.1f}", f"`{g['shape']}`", g["count"], f"`{g['op']}`", f"`{g['source']}`"]
         for g in r["largest"]], "lr") for lbl, r in figures.items() if "float32" in lbl]
    return render("memory_profile.md", preset=PRESET, description=target.description, label=target.label, batch=BATCH,
                  name=target.name, peak=peak, live=live, largest="\n\n".join(largest))


def draw(figures: dict[str, dict], path: Path, target: Target) -> None:
    """Live GiB over the schedule (as a share of it), float32, a line per context; dotted where each context's
    backward and update begin; the arguments (state and batch) dashed."""
    from deliverables.report.output import COLOURS, pyplot, save_figure

    fig, axes = pyplot().subplots(1, 2, figsize=(9.6, 3.4))
    for ax, mode in zip(axes, MODES):
        values = []
        for colour, t in zip(COLOURS, CONTEXTS):
            r = figures.get(label(mode, "float32", t))
            if not r:
                continue
            n, live = r["instructions"], [v / GIB for v in r["timeline"]]
            ax.plot([(i + 0.5) / len(live) for i in range(len(live))], live, color=colour, lw=1, label=f"context {t}")
            for name, (a, _) in list(r["phases"].items())[1:]:
                ax.axvline(a / n, color=colour, lw=0.8, ls=":")
            values += live + [r["argument_bytes"] / GIB]
        if values:
            ax.axhline(values[-1], color="#888", lw=0.8, ls="--", label="arguments (state, batch)")
            span = max(values) - min(values)
            ax.set_ylim(min(values) - 0.1 * span, max(values) + 0.25 * span)
        what = "dotted: backward and update begin" if mode == "train_step" else "no backward"
        ax.set(xlabel="position in the compiled schedule (share of its instructions)", ylabel="live GiB",
               title=f"({'ab'[MODES.index(mode)]}) {mode.replace('_', ' ')}, float32, batch {BATCH} ({what})")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"`{PRESET}` {target.label.split(' (')[0]}: compiled, not a CUDA trace", fontsize=9)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.memory_profile", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--target", default="h100-80gb", help="the GPU to compile for (jaxlm.analysis.devices.TARGETS)")
    p.add_argument("--out", type=Path, default=OUT_DIR, help="where PRESET-memory-profile.{json,md} and the PNG go")
    args = p.parse_args(argv)
    target = parse_target(args.target)
    require_compiler()
    path = args.out / f"{PRESET}-memory-profile.json"
    figures = stored(args.out)
    for lbl, j in rows():
        if lbl not in figures:
            print(f"[memory_profile] compiling {lbl} for {target.name}", flush=True)
            figures[lbl] = profile(j, target)
            write_json(path, {"target": target.name, "rows": figures})
    figures = {lbl: figures[lbl] for lbl, _ in rows()}
    (args.out / f"{PRESET}-memory-profile.md").write_text(page(figures, target))
    draw(figures, args.out / f"{PRESET}-memory-timeline.png", target)
    print(f"wrote {args.out}/{PRESET}-memory-profile.md")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
