"""Every `python -m jaxlm.<command>` command (and subcommand) answers an unknown flag with one `error:` line, exit 2."""

from __future__ import annotations

import pytest

from tests.system.cli_harness import run_one

COMMANDS = [  # module, the arguments before the unknown flag (any required ones filled in)
    ("jaxlm.train", []),
    ("jaxlm.generate", ["--run", "RUN"]),
    ("jaxlm.bench", ["model"]),
    ("jaxlm.bench", ["decode"]),
    ("jaxlm.memory", []),
    ("jaxlm.data", ["list"]),
    ("jaxlm.lora", ["merge", "RUN", "--out", "DIR"]),
    ("jaxlm.quantize", ["RUN"]),
]


@pytest.mark.parametrize("module, args", COMMANDS, ids=[" ".join([m, *a[:1]]) for m, a in COMMANDS])
def test_unknown_flag_is_one_error_line(module, args, tmp_path):
    out = run_one(module, [*args, "--no-such-flag"], str(tmp_path))
    lines = out["stderr"].splitlines()
    assert out["code"] == 2 and len(lines) == 1, out
    assert lines[0].startswith("error: python -m ") and "--no-such-flag" in lines[0], lines
