"""The GPU campaign, every GPU figure the curriculum asks for within a time budget: its plan, runner and command
(docs/gpu.md), which `python -m deliverables.gpu.offline` shares."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # device peaks reflect what each step used

from jaxlm import cli  # noqa: E402
from jaxlm.core.errors import UsageError, UserError  # noqa: E402
from jaxlm.core.files import atomic_write, read_json  # noqa: E402

PROG = "python -m deliverables.gpu"
DEFAULT_OUT = Path("docs/results/gpu")  # the committed GPU report: full runs on a GPU only
SMOKE_OUT = Path("runs/gpu_smoke")
REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 25.0  # process start, JAX import and device initialisation on a fresh machine
STARTUP = (("startup", STARTUP_S, "process start, JAX import, device initialisation"),)  # the call's phase before
MIN_PARTIAL_S = 30.0  # the least a step that stops between rows is started with
STEP_SLACK = 1.5  # a step that fits stops between rows once it has run this many times its estimate


def steps():
    """The steps, most important first (imported on use: they load JAX)."""
    from deliverables.gpu import profile as p
    from deliverables.gpu import steps as s

    return (
        s.Step("profile", "Where the time goes: kernels from a profiler trace, predicted against measured per group",
               p.run_profile, 50.0, 8.0, cuts=False),
        s.Step("techniques", "Techniques at context 1024: remat none / full / dots_saveable, cuDNN attention",
               s.run_techniques, s.techniques_seconds(), 6.0),
        s.Step("attention", "cuDNN vs XLA attention: parity to float32 and speed, forward and backward",
               s.run_attention, s.ATTENTION_SECONDS, 4.0),
        s.Step("max_batch", "Largest batch per technique at context 1024 (`small`)", s.run_max_batch,
               s.max_batch_seconds(), 8.0),
        s.Step("bench_bf16", "The curriculum bench table, bfloat16 (XLA attention)", s.table_run("bfloat16"),
               s.table_seconds("bfloat16"), 10.0),
        s.Step("shakespeare", f"Shakespeare GPU recipe: time to validation loss {s.TARGET_VAL_LOSS}",
               s.run_shakespeare, 120.0, 30.0, cuts=False),
        s.Step("bench_f32", "The curriculum bench table, float32 (XLA attention)", s.table_run("float32"),
               s.table_seconds("float32"), 10.0),
    )


def plan(steps, budget: float, only: list[str] | None, smoke: bool, startup: float = STARTUP_S):
    """(step, estimated seconds, "run" or why it is cut or left out), in order. A step that does not fit runs
    cut at the budget when it stops between rows and at least MIN_PARTIAL_S are left; else it is deferred."""
    out, used = [], startup
    for step in steps:
        est = step.estimate(smoke)
        if only and step.name not in only:
            out.append((step, est, "not chosen (--only)"))
        elif smoke or used + est <= budget:
            used += est
            out.append((step, est, "run"))
        elif step.cuts and budget - used >= MIN_PARTIAL_S:
            out.append((step, est, f"cut at the budget: {budget - used:.0f} s of its {est:.0f} s "
                                   f"(the rest: --only {step.name})"))
            used = budget
        else:
            out.append((step, est, f"deferred: its {est:.0f} s do not fit the {max(budget - used, 0):.0f} s left "
                                   f"(run it with --only {step.name})"))
    return out


def format_plan(rows, budget: float, before: tuple = STARTUP, after: tuple = ()) -> str:
    """The plan as a table: the phases `before` (name, seconds, what), the steps, `after`; the total of what runs."""
    row = lambda name, seconds, what: f"{name:12s} {seconds:13.0f}  {what}"
    lines = [f"{'step':12s} {'est. s (H100)':>13s}  what", *(row(*r) for r in before)]
    lines += [row(step.name, est, step.title + ("" if status == "run" else f"  [{status}]"))
              for step, est, status in rows]
    ran = sum(est for _, est, status in rows if status == "run")
    cut = any(status.startswith("cut") for _, _, status in rows)
    total = budget if cut else overhead(before, after) + ran
    lines += [*(row(*r) for r in after), row("total", total, f"of a {budget:.0f} s budget")]
    return "\n".join(lines)


def overhead(*phases: tuple) -> float:
    """The seconds of a call's phases besides its steps ((name, seconds, what) each)."""
    return sum(seconds for group in phases for _, seconds, _ in group)


def write_report(out: Path, results: dict, rows, meta: dict, notes: dict | None = None) -> None:
    """report.md: every step's section, or the reason it has none; results.json: everything."""
    from deliverables.gpu.sections import checks_section, section

    parts = ["# GPU campaign", "", f"Command: `{meta['command']}`. Device: {meta['device']}; "
             f"jax {meta['jax']}. Step times: mean +- std over {meta['steps']} steps after {meta['warmup']} "
             f"warm-up steps. Memory: the device's peak bytes in use (its memory stats) unless a column says "
             f"otherwise; estimates come from `python -m jaxlm.memory` and are labelled as such.", ""]
    if meta.get("checks"):
        parts += ["## Correctness on this device", "", checks_section(meta["checks"], meta.get("preflight")), ""]
    for step, est, status in rows:
        parts += [f"## {step.title}", ""]
        res = results.get(step.name)
        if res is None:
            why = (notes or {}).get(step.name) or (status if status != "run" else "the call ended before this step")
            parts += [f"Not run: {why}.", ""]
        elif "error" in res:
            parts += [f"Failed: {res['error']}", ""]
        else:
            parts += [section(step.name, res), ""]
    atomic_write(out / "report.md", "\n".join(parts))
    atomic_write(out / "results.json", json.dumps({"meta": meta, "steps": results}, indent=1, default=str))


def _earlier(out: Path, smoke: bool) -> dict:
    """Step results of an earlier call into the same --out (kept unless rerun, so calls accumulate)."""
    data = read_json(out / "results.json", default=None)
    same = isinstance(data, dict) and data.get("meta", {}).get("smoke") == smoke
    return dict(data.get("steps", {})) if same else {}


def run(args, out: Path, deadline: float | None = None, scratch: Path | None = None,
        after_step: Callable[[], object] = lambda: None, startup: float = STARTUP_S, meta: dict | None = None) -> dict:
    """The plan's steps into `out` until `deadline` (time.monotonic(); default: --budget from now, less `startup`),
    each started only if it fits the time then left; `after_step()` after each. The failed steps (name -> error)."""
    import jax

    from deliverables.gpu.steps import Context

    out.mkdir(parents=True, exist_ok=True)
    deadline = deadline if deadline is not None else time.monotonic() + args.budget - startup
    rows = plan(steps(), args.budget, args.only, args.smoke, startup)
    ctx = Context(out=out, smoke=args.smoke, deadline=deadline, scratch=scratch)
    # every program cached: a row's program compiled again for its prediction is then loaded, not recompiled
    jax.config.update("jax_compilation_cache_dir", str(ctx.scratch / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    meta = {"command": f"{PROG} " + " ".join(args.argv), "device": ctx.device, "jax": jax.__version__,
            "steps": ctx.steps, "warmup": ctx.warmup, "smoke": args.smoke, **(meta or {})}
    results, notes, failed = _earlier(out, args.smoke), {}, {}
    write_report(out, results, rows, meta, notes)
    for step, est, status in rows:
        if status.startswith("not chosen"):
            continue
        left = deadline - time.monotonic()
        fits = args.smoke or est <= left
        if not fits and not (step.cuts and left >= MIN_PARTIAL_S):
            notes[step.name] = f"deferred: {max(left, 0):.0f} s left < its estimated {est:.0f} s (--only {step.name})"
            print(f"[{step.name}] {notes[step.name]}", flush=True)
            continue
        slack = fits and not args.smoke  # a step that fits stops at STEP_SLACK times its estimate
        ctx.deadline = min(deadline, time.monotonic() + STEP_SLACK * est) if slack else deadline
        print(f"[{step.name}] {step.title} (estimated {est:.0f} s, {left:.0f} s left)", flush=True)
        t0 = time.monotonic()
        try:
            results[step.name] = step.run(ctx)
        except Exception as e:  # one failed step must not cost the others
            results[step.name] = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
            failed[step.name] = results[step.name]["error"]
        results[step.name]["seconds"] = time.monotonic() - t0
        atomic_write(out / f"{step.name}.json", json.dumps(results[step.name], indent=1, default=str))
        write_report(out, results, rows, meta, notes)
        outcome = f"FAILED: {failed[step.name]}" if step.name in failed else "done"
        print(f"[{step.name}] {outcome} in {results[step.name]['seconds']:.0f} s", flush=True)
        after_step()
    print(f"wrote {out / 'report.md'}")
    return failed


def in_report(out: Path) -> bool:
    """Whether `out` lies in the committed GPU report, which only a full run on a GPU (or merge) writes."""
    return any(out.resolve().is_relative_to(d) for d in (DEFAULT_OUT.resolve(), REPO / DEFAULT_OUT))


def output_dir(args) -> Path:
    """Where this call writes: a full run the committed GPU report, so it needs a GPU; a smoke run anywhere else."""
    if args.smoke:
        out = Path(args.out) if args.out else SMOKE_OUT
        cli.check_option(not in_report(out), "--out", args.out,
                         f"a --smoke run's tiny-model figures never go into {DEFAULT_OUT}/; give another --out")
        return out
    import jax

    if jax.default_backend() != "gpu":
        raise UsageError(f"{PROG}: no GPU here (JAX's backend is {jax.default_backend()}); run it on a GPU, "
                         "or use --dry-run (the plan) or --smoke (every step at a tiny size, any machine)")
    return Path(args.out) if args.out else REPO / DEFAULT_OUT


class CallFailed(UserError):
    """Part of the call failed (a step, a check, the install); the rest's results are written (exit 1)."""

    exit_code = 1


def check_failures(prog: str, failures: dict[str, str], out: Path) -> None:
    """One line (exit 1) naming what failed (`failures`: what -> why), unless nothing did."""
    if failures:
        said = "; ".join(f"{what}: {why}" for what, why in failures.items())
        raise CallFailed(f"{prog}: {len(failures)} part(s) failed: {said}; the rest's results are in {out}")


def arguments(prog: str, doc: str, budget: float, out: str) -> cli.ArgumentParser:
    """The options of both campaign commands (this one and deliverables.gpu.offline); `out`: the default --out."""
    parser = cli.ArgumentParser(command=prog.split()[-1], prog=prog, description=doc,
                                formatter_class=cli.HelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="print the plan with estimated seconds and exit")
    parser.add_argument("--smoke", action="store_true", help="every step at a tiny size (runs on a CPU)")
    parser.add_argument("--budget", type=cli.bounded(float, 0, open_low=True), default=budget,
                        help="seconds the whole call may take; steps that would not fit are deferred")
    parser.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps")
    parser.add_argument("--out", help=f"where report.md, results.json and STEP.json go (default: {out})")
    return parser


def parse(parser, argv: list[str], before: tuple = STARTUP, after: tuple = ()):
    """The arguments (--only checked), or None once --dry-run has printed the plan (`before`, `after`: the call's
    phases around the steps)."""
    args = parser.parse_args(argv)
    args.argv = argv
    names = [s.name for s in steps()]
    unknown = [n for n in args.only or [] if n not in names]
    cli.check_option(not unknown, "--only", " ".join(unknown), f"unknown step; known: {', '.join(names)}")
    if not args.dry_run:
        return args
    rows = plan(steps(), args.budget, args.only, args.smoke, overhead(before, after))
    print(format_plan(rows, args.budget, before, after))
    return None


def main(argv: list[str]) -> int:
    args = parse(arguments(PROG, __doc__, 540.0, f"{DEFAULT_OUT}, with --smoke {SMOKE_OUT}"), argv)
    if args is None:
        return 0
    out = output_dir(args)
    check_failures(PROG, {f"step {name}": why for name, why in run(args, out).items()}, out)
    return 0
