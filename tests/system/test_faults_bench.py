"""`python -m jaxlm.bench` when things go wrong (issue 46, items 10 and 14; docs/errors.md): a signal during a timed
sweep keeps the rows measured, and an output path that cannot be written stops the command before any work."""

import json
import signal
from pathlib import Path

import pytest

from jaxlm import cli
from jaxlm.bench.commands import main as bench
from tests.system.fault_helpers import sets, signalled

TINY = ["model.num_layers=1", "model.d_model=32", "model.num_heads=2", "model.d_ff=64", "model.vocab_size=128"]
UNWRITABLE = "/proc/jaxlm-no-such-folder/rows.json"  # /proc takes no new files, not even root's


def _sweep_stopped_by(sig: int, out: Path) -> tuple[int, str, str]:
    """A timed sweep of four rows on the CPU, signalled once the first row is printed: exit code, stdout, stderr."""
    return signalled(["-m", "jaxlm.bench", "model", *sets(TINY), "--context", "16", "32", "--batch", "2", "4",
                      "--warmup", "0", "--steps", "1", "--json", str(out)], "[bench]", sig)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.extended)],
                         ids=["SIGTERM", "SIGINT"])  # both set the same stop flag
def test_a_signal_during_a_timed_sweep_keeps_the_rows_measured(sig, tmp_path):
    code, out, err = _sweep_stopped_by(sig, tmp_path / "rows.json")
    assert code == 130 and "Traceback" not in err, err
    kept = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert 1 <= len(kept) < 4 and all(r["status"] == "ok" and r["step_ms"] > 0 for r in kept)
    assert err.strip().splitlines()[-1] == (f"interrupted: {signal.Signals(sig).name}: stopped after {len(kept)} of "
                                            f"4 rows; kept in the table above and {tmp_path / 'rows.json'}")
    assert "step ms" in out  # the table of what was measured


@pytest.mark.parametrize("what", [["model"], ["ops"], ["model", "--target", "h100-80gb"],
                                  ["ops", "--target", "h100-80gb"]], ids=" ".join)
@pytest.mark.parametrize("where", ["a folder", "read-only"])
def test_an_output_that_cannot_be_written_stops_before_the_sweep(what, where, tmp_path, capsys):
    path = str(tmp_path) if where == "a folder" else UNWRITABLE
    assert cli.run(bench, [*what, *sets(TINY), "--context", "16", "--batch", "2", "--json", path]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --json {path}: cannot be written ("), err
    assert "is a directory" in err[0] if where == "a folder" else "not writable" in err[0]
    assert captured.out == ""  # nothing measured, nothing compiled


def test_a_json_path_in_a_folder_still_to_be_made_is_fine(tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "rows.json"
    assert cli.run(bench, ["model", *sets(TINY), "--context", "16", "--batch", "2", "--warmup", "0", "--steps", "1",
                           "--json", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["status"] == "ok"
