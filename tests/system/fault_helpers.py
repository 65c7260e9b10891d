"""Helpers of the fault tests (tests/system/test_faults_*.py, test_bad_invocations.py): a subprocess's
environment, --set flags, a directory's bytes, a run's metrics rows, a truncated checkpoint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.train_helpers import ROOT

PY = sys.executable
HELPERS = str(ROOT / "tests" / "train_helpers.py")
# Checkpoints every 3 steps (the newest 2 kept), dropout on (its RNG stream is state too),
# a fixed cosine length (the schedule does not depend on train.steps), a metrics row per step.
RUN = {"train.steps": 30, "checkpoint.every": 3, "optim.cosine_steps": 40, "train.eval_every": 10,
       "model.dropout": 0.1, "log.sample_tokens": 8}


def env(**extra) -> dict[str, str]:
    """This process's environment for a CPU subprocess that imports the checkout, with `extra` set."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    for k in ("XLA_FLAGS", "JAXLM_DEBUG"):
        out.pop(k, None)
    return {**out, **extra}


def sets(overrides: list[str]) -> list[str]:
    return sum((["--set", o] for o in overrides), [])


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
