"""What the fault tests (tests/system/test_faults_*.py, test_bad_invocations.py) share: --set flags, a table of
command lines run in one process (`cli_harness.py`) with each row's exit code and stderr, a registered command's
extra, a directory's bytes, a run's metrics rows, a truncated checkpoint (a child's environment:
tests.train_helpers.env)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from tests.train_helpers import ROOT, env, needs

PY = sys.executable
HELPERS = str(ROOT / "tests" / "train_helpers.py")
# Checkpoints every 3 steps (the newest 2 kept), dropout on (its RNG stream is state too),
# a fixed cosine length (the schedule does not depend on train.steps), a metrics row per step.
RUN = {"train.steps": 30, "checkpoint.every": 3, "optim.cosine_steps": 40, "train.eval_every": 10,
       "model.dropout": 0.1, "log.sample_tokens": 8}


def _quick_commands() -> dict[str, list[str]]:
    """Every registered command (jaxlm.cli.registry), with arguments that run it quickly without input: the signal
    and pipe tests go over them all."""
    from jaxlm.cli import registry

    quick = {"jaxlm.train": ["--help-config"], "jaxlm.data": ["list"]}
    return {c.module: quick.get(c.module, ["--help"]) for c in registry.commands()}


COMMANDS = _quick_commands()


def needs_of(command) -> list:
    """The `extra` mark (tests.train_helpers.needs) of a registered command (jaxlm.cli.registry) that needs a pyproject
    extra the tests know how to look for; none for the others."""
    from jaxlm.core import extras

    extra = re.match(r"the '([\w-]+)' extra", command.needs)
    known = {*extras.known().values(), "gpu-compile"}
    return [needs(extra.group(1))] if extra and extra.group(1) in known else []


def sets(overrides: list[str]) -> list[str]:
    return sum((["--set", o] for o in overrides), [])


def signalled(args: list[str], prefix: str, sig: int) -> tuple[int, str, str]:
    """`python ARGS`, sent `sig` once a stdout line starts with `prefix`: exit code, stdout, stderr."""
    proc = subprocess.Popen([sys.executable, *args], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    watchdog = threading.Timer(600, proc.kill)
    watchdog.start()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            proc.send_signal(sig)
            break
    rest, err = proc.communicate()
    watchdog.cancel()
    return proc.returncode, "".join(lines) + rest, err


# `python LIMITED BYTES SCRIPT ARGS...`: SCRIPT run under an address-space limit (`ulimit -v`), set in the child
# itself (a preexec_fn would fork a parent that runs JAX's threads).
LIMITED = ("import resource, runpy, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_AS, (n, n)); "
           "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run_rows(rows: list[tuple[str, list]], work: Path, cwd: Path | None = None, timeout: int = 900,
             address_space: int | None = None, **extra_env) -> list[dict]:
    """Each (module, args) as `python -m module *args` in one process (under an `address_space` limit in bytes
    when given): [{"code", "stderr"}] per row."""
    cwd = cwd or work
    cwd.mkdir(parents=True, exist_ok=True)
    (work / "rows.json").write_text(json.dumps([[m, [str(a) for a in args], str(cwd)] for m, args in rows]))
    launcher = [PY] if address_space is None else [PY, "-c", LIMITED, str(address_space)]
    r = subprocess.run([*launcher, str(ROOT / "tests" / "system" / "cli_harness.py"), str(work / "rows.json"),
                        str(work / "out.json")], env=env(**extra_env), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((work / "out.json").read_text())


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def one_error(got: dict, code: int, *culprits: str) -> str | None:
    """None when the row exited `code` with exactly one `error:` line naming every culprit and no traceback,
    else what went wrong (for the assertion message)."""
    errors = error_lines(got["stderr"])
    if got["code"] == code and len(errors) == 1 and all(c in errors[0] for c in culprits) \
            and "Traceback" not in got["stderr"]:
        return None
    return f"exit {got['code']} (want {code}), culprits {culprits}, stderr:\n  " + "\n  ".join(
        got["stderr"].splitlines()[-6:])


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def rows(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def last_train_step(run: Path) -> int:
    """The newest train row's step in RUN/metrics.jsonl (0 before the first), read while it is being written."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [0]
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # being written
        if row.get("kind") == "train":
            steps.append(row["step"])
    return max(steps)


def truncate_checkpoint(step_dir: Path) -> None:
    """Cut every data file of a checkpoint in half, as a full disk or a bad copy would."""
    for f in step_dir.rglob("*"):
        if f.is_file() and f.parent.name == "d":
            os.truncate(f, f.stat().st_size // 2)
