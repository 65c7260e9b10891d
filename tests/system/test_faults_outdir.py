"""train.out_dir is a run's own directory (issue 36, item 7): a non-empty directory that is not a run (the
user's own metrics.jsonl and notes), the file system's root and a home directory are refused in one line
before anything is written; a directory a plan runner prepared (its spec and log) is trained in."""

from __future__ import annotations

from pathlib import Path

from tests.system.fault_helpers import one_error, run_rows, sets
from tests.train_helpers import make_corpus, tiny_overrides


def test_out_dir_must_be_a_run_of_its_own(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    home = tmp_path / "home"
    home.mkdir()
    mine = tmp_path / "mine"  # a directory of the user's: their own metrics and notes
    mine.mkdir()
    (mine / "metrics.jsonl").write_text('{"mine": 1}\n')
    (mine / "notes.txt").write_text("do not lose this\n")
    prepared = tmp_path / "prepared"  # what experiments.run writes before it starts the run there
    prepared.mkdir()
    (prepared / "spec.json").write_text("{}\n")
    (prepared / "output.log").write_text("$ python -m jaxlm.train ...\n")
    before_root = {p.name for p in Path("/").iterdir()}

    def train(out) -> tuple[str, list[str]]:
        return "jaxlm.train", sets(tiny_overrides(corpus, out, **{"train.steps": 2, "train.eval_every": 2,
                                                                  "data.eval_tokens": 64, "checkpoint.every": 2}))

    rows = [train(mine), train("/"), train(home), train(prepared)]
    refused_mine, refused_root, refused_home, runner = run_rows(rows, tmp_path / "rows", HOME=str(home))
    assert one_error(refused_mine, 2, "train.out_dir", "not empty and not a jaxlm run", "metrics.jsonl, notes.txt") \
        is None, refused_mine["stderr"]
    assert (mine / "metrics.jsonl").read_text() == '{"mine": 1}\n' and sorted(p.name for p in mine.iterdir()) == [
        "metrics.jsonl", "notes.txt"]
    assert one_error(refused_root, 2, "train.out_dir = '/'", "root") is None, refused_root["stderr"]
    assert {p.name for p in Path("/").iterdir()} == before_root
    assert one_error(refused_home, 2, "train.out_dir", "home directory") is None, refused_home["stderr"]
    assert sorted(p.name for p in home.iterdir()) == []
    assert runner["code"] == 0, runner["stderr"][-2000:]
    assert (prepared / "checkpoints" / "2").is_dir() and (prepared / "spec.json").read_text() == "{}\n"
