"""What the fault tests of issue 36 share: the environment of a child process, `--set` flags, and a table of
command lines run in one process (`cli_harness.py`) with each row's exit code and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.train_helpers import ROOT

PY = sys.executable


def env(**extra) -> dict:
    """The test's environment for a child: the repository importable, JAX on the CPU, no debug switches."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    for k in ("XLA_FLAGS", "JAXLM_DEBUG"):
        out.pop(k, None)
    return {**out, **extra}


def sets(overrides: list[str]) -> list[str]:
    return sum((["--set", o] for o in overrides), [])


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
