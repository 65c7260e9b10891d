"""Run an experiment plan: `python -m experiments.run PLAN [--only NAME ...] [--dry-run] [--size cpu|gpu]`.

How runs are recorded, resumed and interrupted: docs/experiments.md."""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from contextlib import suppress
from pathlib import Path

from experiments import commands
from experiments.commands import BUILDERS, Device, train_config, unmet_requirement
from experiments.estimate import THROUGHPUT, estimate_seconds, format_seconds, list_plans, plan_estimate
from experiments.plan import Plan, PlanError, RunSpec, load_plan, plan_names
from experiments.results import DONE_STATUSES, RESULT, has_nonfinite_loss, load_bench, read_metrics, summarise_train
from jaxlm import cli
from jaxlm.analysis.flops import param_counts
from jaxlm.core import host, stop
from jaxlm.core.config import ModelConfig
from jaxlm.core.errors import CorpusMissing, UserError
from jaxlm.core.files import read_json, write_json
from jaxlm.core.lock import DirLock
from jaxlm.core.typedconfig import from_dict, to_dict
from jaxlm.data.corpora import data_root, resolve_sources
from jaxlm.data.prepare import META

ERROR_TAIL_LINES = 40
# The trainer's TrainingDiverged line in a run's output: "error: loss 5.5, parameter norm nan at step 41 ...".
DIVERGED_RE = re.compile(r"\bloss -?(nan|inf)\b|parameter norm -?(nan|inf)\b")


def validate(plan: Plan, plan_dir: Path, dry_run: bool = False) -> list[str]:
    """Resolve every train run's config and data now, so a bad override or a missing corpus fails
    before hours of runs, naming the run. A dry run only previews: it returns the missing corpora instead."""
    missing: list[str] = []
    for spec in plan.runs:
        if spec.kind != "train":
            continue
        try:
            data = train_config(spec, plan_dir / spec.name).data
            if not (Path(data.dir) / META).is_file():  # not tokenised yet: its sources must exist
                resolve_sources([*data.source, *data.val_source])
        except UserError as e:
            if not (dry_run and isinstance(e, CorpusMissing)):
                raise PlanError(f"{plan.path}: run '{spec.name}': {e}") from None
            missing += [] if e.name in missing else [e.name]
    return missing


def _tail(path: Path, start: int) -> str:
    """The last ERROR_TAIL_LINES lines written to `path` after byte offset `start` (this attempt's output)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return "\n".join(f.read().decode(errors="replace").splitlines()[-ERROR_TAIL_LINES:])
    except OSError:
        return ""


def wait(proc: subprocess.Popen, timeout: float | None) -> tuple[int, int | None]:
    """Wait for the child like Popen.wait, also returning its peak resident memory (bytes, from wait4)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.01
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024  # Linux reports KiB
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def stop_child(proc: subprocess.Popen, grace: float | None = None) -> int:
    """SIGTERM to the child's process group (its own session: Ctrl-C reaches only the runner), SIGKILL after `grace`
    seconds or at a second signal to the runner; returns its exit code."""
    def signal_group(sig: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    signal_group(signal.SIGTERM)
    try:
        return proc.wait(timeout=grace)
    except KeyboardInterrupt:
        print("second signal: killing the run without waiting for its checkpoint", file=sys.stderr, flush=True)
    except subprocess.TimeoutExpired:
        pass
    signal_group(signal.SIGKILL)
    return proc.wait()


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def is_complete(run_dir: Path, spec: RunSpec) -> dict | None:
    r = read_json(run_dir / RESULT, default=None)
    return r if isinstance(r, dict) and r.get("status") in DONE_STATUSES and r.get("spec_hash") == spec.hash else None


def prepare_dir(run_dir: Path, spec: RunSpec) -> bool:
    """Make the run directory, wiped unless it holds an interrupted run of the same spec; True when resuming."""
    old = read_json(run_dir / "spec.json", default=None)
    stale = not isinstance(old, dict) or old.get("spec_hash") != spec.hash
    ended = read_json(run_dir / RESULT, default={"status": "unreadable"}) if (run_dir / RESULT).exists() else None
    if run_dir.exists() and (stale or (ended is not None and ended.get("status") != "interrupted")):
        shutil.rmtree(run_dir)
    resuming = run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "spec.json", {"spec_hash": spec.hash, "spec": spec.to_dict()})
    return resuming


def collect(spec: RunSpec, run_dir: Path) -> dict:
    """Final metrics of a finished run, by kind; a train run's also its saved config, size and corpus."""
    out: dict = {}
    if records := read_metrics(run_dir / "metrics.jsonl"):
        out["metrics"] = summarise_train(records)
    if spec.kind == "bench":
        out["bench_rows"], meta = load_bench(run_dir / "bench.json")
        if meta.get("max_batch"):
            out["bench_max_batch"] = meta["max_batch"]
    if spec.kind != "train":
        return out
    try:  # the config the trainer actually resolved and saved
        cfg = out["config"] = tomllib.loads((run_dir / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return out
    if m := out.get("metrics"):
        try:
            counts = param_counts(from_dict(ModelConfig, cfg["model"]))
            m["params"], m["params_non_embedding"] = counts["total"], counts["non_embedding"]
        except Exception:  # a config this version cannot read: no parameter count, nothing else lost
            pass
        if "steps" in m:
            m["tokens"] = m["steps"] * cfg["data"]["batch_size"] * cfg["model"]["context_length"]
    data_dir = cfg.get("data", {}).get("dir")
    data_meta = read_json(Path(data_dir) / META, default=None) if data_dir else None
    if isinstance(data_meta, dict):  # the corpus the report's setup section describes, kept with the result
        out["data"] = {k: data_meta.get(k) for k in ("tokenizer", "vocab_size", "tokens")}
        sources = (data_meta.get("sources") or {}).get("train", [])
        train = [Path(s.get("path", "?")) for s in sources if isinstance(s, dict)]
        out["data"]["sources"] = [f"{p.parent.name}/{p.name}" for p in train]
    return out


def execute(spec: RunSpec, run_dir: Path, device: Device, git: dict, plan: Plan) -> dict:
    """Run one spec to completion and return its result record (not yet written)."""
    result = {"name": spec.name, "plan": plan.name, "size": plan.size, "kind": spec.kind, "axes": spec.axes,
              "spec": spec.to_dict(), "spec_hash": spec.hash, "git": git, "device": device.kind,
              "platform": device.platform, "device_count": device.count, "started_at": _now(),
              "host": {**{k: v for k, v in host.describe().items() if k != "load_avg_1m"},
                       "load_avg_1m_start": os.getloadavg()[0]},
              "versions": commands.software_versions()}
    if spec.kind == "train":
        result["config"] = to_dict(train_config(spec, run_dir))
    if reason := unmet_requirement(spec, device):
        return {**result, "status": "skipped", "reason": reason, "finished_at": _now(), "wall_time_s": 0.0}

    result["resumed"] = prepare_dir(run_dir, spec)
    argv = result["argv"] = BUILDERS[spec.kind](spec, run_dir)
    t0 = time.perf_counter()
    with open(run_dir / "output.log", "ab") as log:
        log.write(f"\n$ {shlex.join(argv)}\n".encode())
        log.flush()
        start = log.tell()
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        max_rss, timed_out = None, False
        try:
            rc, max_rss = wait(proc, spec.timeout)
        except subprocess.TimeoutExpired:
            rc, timed_out = stop_child(proc, grace=20), True
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM to the runner: the run stops the same way, then is recorded
            rc = stop_child(proc)
            write_json(run_dir / RESULT, {**result, "status": "interrupted", "reason": f"{stop.signal_name(e)} to the "
                                          f"runner; the run stopped with exit code {rc}", "returncode": rc,
                                          "finished_at": _now(), "wall_time_s": time.perf_counter() - t0})
            raise
        except BaseException:  # the runner failing: take the child down with it
            stop_child(proc, grace=20)
            raise
    result.update(collect(spec, run_dir))
    result.update({"returncode": rc, "finished_at": _now(), "wall_time_s": time.perf_counter() - t0,
                   "max_rss_bytes": max_rss})
    result["host"]["load_avg_1m_end"] = os.getloadavg()[0]  # other work on the machine skews timings
    return {**result, **outcome(spec, run_dir, rc, timed_out, _tail(run_dir / "output.log", start))}


def outcome(spec: RunSpec, run_dir: Path, rc: int, timed_out: bool, tail: str) -> dict:
    """The status of a finished child (failed, diverged or ok), with the reason and its output's tail."""
    if timed_out:
        return {"status": "failed", "reason": f"timed out after {spec.timeout:g} s", "error_tail": tail}
    said = next((line for line in tail.splitlines() if DIVERGED_RE.search(line)), None)
    if spec.kind != "bench" and (has_nonfinite_loss(read_metrics(run_dir / "metrics.jsonl")) or (rc != 0 and said)):
        reason = said[:300] if said else "the loss became NaN/inf"
        return {"status": "diverged", "reason": reason, "error_tail": tail if rc else None}
    if rc != 0:
        return {"status": "failed", "reason": f"exit code {rc}", "error_tail": tail}
    return {"status": "ok"}


def headline(result: dict) -> str:
    """One line about a finished run for the progress log."""
    m = result.get("metrics", {})
    status = result["status"]
    parts = [status if status == "skipped" else f"{status} in {result.get('wall_time_s', 0):.1f} s"]
    for key, label, fmt in (("eval_loss", "val loss", ".3f"), ("eval_ppl", "val ppl", ".2f"),
                            ("tokens_per_s", "tok/s", ".0f")):
        if isinstance(m.get(key), (int, float)):
            parts.append(f"{label} {m[key]:{fmt}}")
    if result.get("bench_rows"):
        parts.append(f"{len(result['bench_rows'])} bench rows")
    if result.get("reason") and status != "ok":
        parts.append(f"({result['reason']})")
    return ", ".join(parts)


def write_plan_meta(plan: Plan, plan_dir: Path, device: Device) -> None:
    """plan.json; the plan file named from the working directory, as the run directories are (no machine path)."""
    plan_dir.mkdir(parents=True, exist_ok=True)
    path, cwd = plan.path.resolve(), Path.cwd().resolve()
    file = path.relative_to(cwd) if path.is_relative_to(cwd) else path
    write_json(plan_dir / "plan.json", {"name": plan.name, "file": str(file), "size": plan.size,
                                        "description": plan.description, "report": plan.report, "device": device.kind,
                                        "runs": [{"name": r.name, "kind": r.kind, "axes": r.axes} for r in plan.runs]})


def run_plan(plan: Plan, plan_dir: Path, device: Device, only: list[str] | None = None, dry_run: bool = False,
             draft: bool = False) -> dict[str, int]:
    """Execute (or with dry_run, list) the selected runs; returns a count per status. Refuses a tree with
    uncommitted changes unless `draft` (recorded in every result)."""
    runs = plan.select(only)
    missing = validate(plan, plan_dir, dry_run)
    git = {**commands.git_info(), "draft": draft}
    if not (dry_run or draft):
        commands.check_committed(git)
    print(f"plan {plan.name} ({plan.path}), size {plan.size}, {len(runs)} of {len(plan.runs)} runs -> {plan_dir}, "
          f"device {device.kind}", flush=True)
    if dry_run:
        return _run_all(plan, plan_dir, runs, device, git, dry_run=True, missing=missing)
    with DirLock(plan_dir, f"plan {plan.name}: {plan_dir}"):  # one runner per plan directory
        write_plan_meta(plan, plan_dir, device)
        return _run_all(plan, plan_dir, runs, device, git)


def _run_all(plan: Plan, plan_dir: Path, runs: list[RunSpec], device: Device, git: dict,
             dry_run: bool = False, missing: list[str] | None = None) -> dict[str, int]:
    """Each run in turn; a dry run prints each command and estimate instead, then the `missing` corpora."""
    counts: Counter[str] = Counter()
    pending = []
    for i, spec in enumerate(runs, 1):
        run_dir = plan_dir / spec.name
        prefix = f"[{i}/{len(runs)}] {spec.name} ({spec.kind}"
        if done := is_complete(run_dir, spec):
            counts["complete"] += 1
            print(f"{prefix}): already {done['status']}, skipped", flush=True)
        elif dry_run:
            counts["pending"] += 1
            pending.append(spec)
            print(prefix + _preview(spec, run_dir, device), flush=True)
        else:
            print(f"{prefix}) ...", flush=True)
            result = execute(spec, run_dir, device, git, plan)
            run_dir.mkdir(parents=True, exist_ok=True)
            write_json(run_dir / RESULT, result)  # last: its presence marks the run complete
            counts[result["status"]] += 1
            print(f"{prefix}): {headline(result)}", flush=True)
            if result["status"] == "failed" and result.get("error_tail"):
                print("    " + "\n    ".join(result["error_tail"].splitlines()[-8:]), flush=True)
    print("done: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)
    if dry_run:
        source = THROUGHPUT.get(device.platform, THROUGHPUT["cpu"]).source
        print(f"estimated time: {plan_estimate(pending, device.platform)} "
              f"on {device.platform} ({source}; see experiments/estimate.py)", flush=True)
        for name in missing or []:
            print(f"needs corpus {name!r}, not in the data root ({data_root()}): run `python -m jaxlm.data download "
                  f"{name}` (or point JAXLM_DATA at a folder that holds it) before running the plan", flush=True)
    return dict(counts)


def _preview(spec: RunSpec, run_dir: Path, device: Device) -> str:
    """A dry run's line about one run: its estimated time and command, or why it would be skipped."""
    if reason := unmet_requirement(spec, device):
        return f"): would skip: {reason}"
    seconds = estimate_seconds(spec, device.platform)
    estimate = f"~{format_seconds(seconds)}" if seconds is not None else "time unknown"
    return f", {estimate}): {shlex.join(BUILDERS[spec.kind](spec, run_dir))}"


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="experiments.run", description=__doc__.split("\n\n")[0],
                           formatter_class=cli.HelpFormatter, epilog=f"plans: {', '.join(plan_names())}")
    p.add_argument("plan", nargs="?", help="plan file, or a plan name in experiments/plans/ (none: list the plans, "
                   "their data and estimated times)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="run only these runs (names or globs)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the runs, their commands and estimated times; run nothing")
    p.add_argument("--size", help="which [sizes.X] variant (default: gpu on a GPU when the plan has one, else the "
                   "plan's first size)")
    p.add_argument("--runs-dir", default="runs", help="parent of the plan directory")
    p.add_argument("--draft", action="store_true", help="run from a tree with uncommitted changes; every record says "
                   "git.draft = true (without it the runner refuses such a tree)")
    args = p.parse_args(argv)
    if args.plan is None:
        print(list_plans())
        return 0
    try:  # SIGTERM (a scheduler's stop) is an interrupt, as Ctrl-C is (jaxlm.core.stop)
        device = commands.detect_device()
        plan = load_plan(args.plan, args.size, device.platform)
        counts = run_plan(plan, Path(args.runs_dir) / plan.name, device, args.only, args.dry_run, args.draft)
    except KeyboardInterrupt as e:
        print(f"\ninterrupted: {stop.signal_name(e)}; the run in progress was stopped and recorded as interrupted, "
              "finished runs are kept; run the same command again to resume", file=sys.stderr)
        return stop.exit_code(e)
    return 1 if counts.get("failed") else 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
