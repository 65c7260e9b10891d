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


def test_a_plugged_in_command_without_its_side_says_how_sides_are_installed(monkeypatch, capsys):
    """`python -m jaxlm.bench nanogpt` where no side is registered (an install older than the entry point): one
    line naming the commands there are and how a side's commands get registered, not argparse's bare choice list."""
    from jaxlm import cli
    from jaxlm.bench import commands, sides

    monkeypatch.setattr(sides, "plugins", lambda: {})
    assert cli.run(commands.main, ["nanogpt", "--steps", "200", "--framework", "both"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: python -m jaxlm.bench nanogpt: not a command here (model, data, decode, ops, matmul, "
                   "parallel); a plugged-in side's commands are registered when the project is installed (pip "
                   "install -e '.[EXTRA]', again after an update), and the sides installed here are: none"], err
