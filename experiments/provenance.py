"""Which code produced a record: the git commit of the tree, and whether it had uncommitted changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from jaxlm.core.errors import UsageError


def git_info(root: Path | None = None) -> dict:
    """The commit of the tree at `root` (default: here) and whether it differs from it: modified tracked
    files or untracked files git does not ignore (a new plan or module changes what runs)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, cwd=root).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain").splitlines()  # "XY path": two status letters, a space, the path
    return {"commit": git("rev-parse", "HEAD").strip() or None, "dirty": bool(changed),
            "changed": [c[3:] for c in changed[:5]]}


def check_committed(git: dict) -> None:
    """Final records come only from a committed tree, so each names the code that produced it."""
    if git["commit"] is None:
        raise UsageError(f"{Path.cwd()}: not a git checkout, so the records could not name their code; run from the "
                         "repository, or pass --draft to record draft runs")
    if git["dirty"]:
        more = ", ..." if len(git["changed"]) == 5 else ""
        raise UsageError(f"{Path.cwd()}: uncommitted changes ({', '.join(git['changed'])}{more}): commit them so "
                         "every record names the code that produced it, or pass --draft to record draft runs")
