"""Every registered command (`python -m jaxlm`; and each subcommand) answers an unknown flag with one `error:` line,
exit 2."""

from __future__ import annotations

import pytest

from jaxlm.cli import registry
from tests.system.cli_harness import run_one
from tests.system.fault_helpers import needs_of

# The arguments a command takes before the unknown flag (a subcommand, any required ones filled in); [] when not here.
ARGS = {
    "jaxlm.generate": [["--run", "RUN"]],
    "jaxlm.bench": [["model"], ["decode"]],
    "jaxlm.data": [["list"]],
    "jaxlm.lora": [["merge", "RUN", "--out", "DIR"]],
    "jaxlm.quantize": [["RUN"]],
    "jaxlm.hf": [["import", "SOURCE", "--out", "RUN"], ["export", "RUN", "--out", "DIR"]],
    "deliverables.gpu.merge": [["DIR"]],
    "deliverables.tokenizer_study": [["train", "RUN"]],
    "deliverables.hf_random": [["--out", "DIR"]],
    "deliverables.gpu.carry": [["check"]],
}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:runpy")  # a package that imported its command
ROWS = [pytest.param(c.module, args, id=" ".join([c.module, *args[:1]]), marks=needs_of(c))
        for c in registry.commands() for args in ARGS.get(c.module, [[]])]


def test_every_command_with_args_here_is_registered():
    assert set(ARGS) <= {c.module for c in registry.commands()}


@pytest.mark.parametrize("module, args", ROWS)
def test_unknown_flag_is_one_error_line(module, args, tmp_path):
    out = run_one(module, [*args, "--no-such-flag"], str(tmp_path))
    lines = out["stderr"].splitlines()
    assert out["code"] == 2 and len(lines) == 1, out
    assert lines[0].startswith("error: python") and "--no-such-flag" in lines[0], lines


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
