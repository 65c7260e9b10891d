"""`python3 -m deliverables.gpu.offline`: the GPU campaign on an offline GPU machine as it is: install the carried
wheels, check the GPU computes right, measure (docs/gpu.md)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before any backend starts: per-step peaks

from deliverables.gpu import carry  # noqa: E402
from jaxlm import cli  # noqa: E402
from jaxlm.core import platform  # noqa: E402
from jaxlm.core.errors import UsageError  # noqa: E402
from jaxlm.core.files import atomic_write, read_json  # noqa: E402

PROG = "python3 -m deliverables.gpu.offline"
OUT, SMOKE_OUT = Path("runs/gpu_offline"), Path("runs/gpu_offline_smoke")
BUDGET_S = 480.0
# The phases before the campaign's steps and after them, with their estimated seconds on the offline machine.
PHASES = (("install", 10.0, "the carried wheels into a folder first on the path, jaxlm from this tree"),
          ("startup", 20.0, "JAX import, CUDA initialisation, versions and imports checked"),
          ("checks", 45.0, "correctness: attention, bf16 training against float32 on the CPU, checkpoint, generate"))
FINISH = (("finish", 5.0, "offline.json and the copies to $OUT"),)
OUT_FILES = ("offline.json", "report.md", "results.json", "calibration.json")
OUT_LIMIT = 16 * 2**20  # bytes per file the device tool brings back
VERSIONS = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax",
            "optax", "orbax-checkpoint", "numpy", "scipy", "grain", "qwix", "tomli-w", "tiktoken", "tensorboard")
# `import flax, jax` first (flax 0.12.9 fails with jax >= 0.11.2), then everything jaxlm and the campaign import.
IMPORTS = ("jax", "flax", "optax", "orbax.checkpoint", "grain", "qwix", "tomli_w", "tiktoken", "tensorboard",
           "jaxlm.training.loop", "jaxlm.nn.quant", "jaxlm.bench.measure", "deliverables.gpu.campaign")


def preflight(smoke: bool) -> tuple[dict, str | None]:
    """Phase 2: (what was found, the reason to stop or None)."""
    from packaging.requirements import Requirement

    found = {"python": sys.version.split()[0], "versions": {n: v for n in VERSIONS if (v := carry.installed(n))},
             "requirements": [], "imports": {}}
    for text in carry.dependencies():  # pyproject.toml's dependencies that the installed versions do not meet
        req = Requirement(text)
        have = carry.installed(req.name)
        if have is None:
            found["requirements"].append(f"{req.name}: not installed ({text})")
        elif not req.specifier.contains(have, prereleases=True):
            found["requirements"].append(f"{req.name} {have} does not meet {text}")
    versions = found["versions"]
    for name in ("jax", *(n for n in VERSIONS if n.startswith("jax-cuda"))):  # one jaxlib release for all of them
        if name in versions and versions[name] != versions.get("jaxlib"):
            found["requirements"].append(f"{name} {versions[name]} is not at jaxlib's version {versions.get('jaxlib')}")
    for name in IMPORTS:
        try:
            importlib.import_module(name)
            found["imports"][name] = "ok"
        except Exception as e:
            found["imports"][name] = f"{type(e).__name__}: {str(e).strip()[:200]}"
            return found, f"import {name} failed: {found['imports'][name]}"
    import jax

    try:
        devices = jax.devices()
    except RuntimeError as e:  # JAX_PLATFORMS names CUDA and it did not start
        return found, f"JAX found no device: {str(e).strip().splitlines()[0][:200]}"
    stats = devices[0].memory_stats() or {}
    found["devices"] = {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices),
                        "bytes_limit": stats.get("bytes_limit")}
    found["environment"] = jax.print_environment_info(return_string=True)
    if devices[0].platform != "gpu" and not smoke:
        return found, f"no GPU: JAX's default device is {devices[0].platform} ({devices[0].device_kind})"
    return found, None


def copy_out(out: Path) -> list[str]:
    """The summary files into $OUT (the device tool's result folder), under its limits; what was copied."""
    dest = os.environ.get("OUT")
    if not dest:
        return []
    files = {name: out / name for name in OUT_FILES}
    try:
        profile = json.loads((out / "results.json").read_text())["steps"]["profile"]["train_step"]["files"]
        files["profile_train_step.trace.json.gz"] = Path(profile["trace"])
        files["profile_train_step.hlo.txt.gz"] = Path(profile["program"])
    except (OSError, ValueError, KeyError, TypeError):  # no profile step (yet)
        pass
    copied = []
    for name, path in files.items():
        if path.is_file() and path.stat().st_size <= OUT_LIMIT:
            shutil.copyfile(path, Path(dest) / name)
            copied.append(name)
    return copied


def _phase(record: dict, name: str, out: Path, fn):
    """Run one phase, timing it into the record; offline.json (and $OUT) written after it."""
    t0 = time.monotonic()
    print(f"[offline] {name}", flush=True)
    result = fn()
    record["phases"][name] = {"seconds": time.monotonic() - t0}
    _write(record, out)
    return result


def _write(record: dict, out: Path) -> None:
    atomic_write(out / "offline.json", json.dumps(record, indent=1, default=str))
    record["copied_to_out"] = copy_out(out)


def run(args, out: Path) -> int:
    from deliverables.gpu import campaign

    t0 = time.monotonic()
    deadline = t0 + args.budget - campaign.overhead(FINISH)
    if not args.smoke and not platform.has_nvidia_driver():  # before installing anything
        raise UsageError(f"{PROG}: no GPU here (no NVIDIA driver: {platform.NVIDIA_DRIVER} is absent); run it on "
                         "the GPU machine, or use --dry-run (the plan) or --smoke (all of it at tiny sizes, anywhere)")
    out.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join([PROG, *args.argv]), "smoke": args.smoke, "budget_s": args.budget,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "phases": {}}
    record["install"] = _phase(record, "install", out,
                               lambda: carry.install(Path(args.carry), Path(args.site), args.smoke))
    if record["install"].get("error"):
        raise UsageError(f"{PROG}: installing the carried wheels failed: {record['install']['error']}")
    if record["install"].get("problem"):  # the smoke's dry run of the install: said now, and fails the call at its end
        print(f"warning: install: {record['install']['problem']}", file=sys.stderr, flush=True)
    if not args.smoke:  # CUDA (and the CPU's float32 reference), here and in subprocesses: no quiet CPU fall back
        os.environ["JAX_PLATFORMS"] = "cuda,cpu"
        if "jax" in sys.modules:  # jaxlm.core.platform.prepare() imported it (no NVIDIA driver file seen)
            sys.modules["jax"].config.update("jax_platforms", "cuda,cpu")
    found, stop = _phase(record, "startup", out, lambda: preflight(args.smoke))
    record["preflight"] = found
    if stop is not None:
        record["stopped"] = stop
        _write(record, out)
        raise UsageError(f"{PROG}: {stop} (details: {out / 'offline.json'})")
    gpu = found["devices"]["platform"] == "gpu"
    from deliverables.gpu.check import run_checks

    scratch = out / "scratch"
    record["checks"] = _phase(record, "checks", out, lambda: run_checks(scratch, gpu, found["devices"]["kind"]))
    meta = {"command": record["command"], "checks": record["checks"], "preflight": found, "install": record["install"]}
    failed = _phase(record, "campaign", out, lambda: campaign.run(
        args, out, deadline, scratch, lambda: copy_out(out), campaign.overhead(PHASES, FINISH), meta))
    record["seconds"] = time.monotonic() - t0
    _write(record, out)
    print(summary(record, out))
    failures = {"install": record["install"]["problem"]} if record["install"].get("problem") else {}
    bad = [r for r in record["checks"]["rows"] if r["ok"] is False]
    if bad:
        failures["checks"] = ", ".join(" ".join(str(r[k]) for k in ("check", "implementation", "window") if r.get(k))
                                       for r in bad) + " failed (offline.json)"
    campaign.check_failures(PROG, {**failures, **{f"step {name}": why for name, why in failed.items()}}, out)
    return 0


def summary(record: dict, out: Path) -> str:
    """The last lines printed: phase times, checks, steps (the device tool returns the end of the output)."""
    lines = ["", f"{'phase':10s} {'seconds':>8s}"]
    lines += [f"{name:10s} {p['seconds']:8.1f}" for name, p in record["phases"].items()]
    for r in record["checks"]["rows"]:
        status = {True: "pass", False: "FAIL", None: "skipped"}[r["ok"]]
        what = {k: r[k] for k in ("implementation", "window", "max_rel_diff", "arrays_equal", "reason") if k in r}
        lines.append(f"check {r['check']:10s} {status:7s} {what}")
    for name, res in read_json(out / "results.json", default={}).get("steps", {}).items():
        state = "failed" if "error" in res else "cut" if res.get("cut") else "done"
        lines.append(f"step  {name:12s} {state:7s} {res.get('seconds', 0):6.0f} s")
    lines.append(f"total {record['seconds']:.0f} s of {record['budget_s']:.0f}; wrote {out}; "
                 f"copied to $OUT: {', '.join(record.get('copied_to_out') or ['nothing ($OUT unset)'])}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from deliverables.gpu import campaign

    parser = campaign.arguments(PROG, __doc__, BUDGET_S, f"{OUT}, with --smoke {SMOKE_OUT}")
    parser.add_argument("--carry", default=str(carry.FOLDER), help="the folder of carried wheels (default: .whl)")
    parser.add_argument("--site", default=str(Path(tempfile.gettempdir()) / "jaxlm-site"),
                        help="where the carried wheels are installed")
    args = campaign.parse(parser, argv, PHASES, FINISH)
    if args is None:
        return 0
    out = Path(args.out) if args.out else SMOKE_OUT if args.smoke else OUT  # never the committed report: merge fills it
    cli.check_option(not campaign.in_report(out), "--out", args.out, f"the offline run writes its own folder, not "
                     f"{campaign.DEFAULT_OUT}/ (python -m deliverables.gpu.merge takes its results there)")
    return run(args, out)


if __name__ == "__main__":
    sys.exit(cli.run(main))
