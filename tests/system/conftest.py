"""Fixtures of the fault tests: a tiny corpus, the uninterrupted reference run, and the broken inputs of the
bad-invocation table (built once per worker that needs them: the tests sharing one are in one xdist_group)."""

from __future__ import annotations

import os
import shutil
from typing import Iterator

import numpy as np
import pytest

from jaxlm.core.config import load_config
from tests.system.fault_helpers import RUN, truncate_checkpoint
from tests.train_helpers import hold_locks, make_corpus, tiny_overrides


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory):
    """The uninterrupted 30-step run every interrupted one must reproduce."""
    from jaxlm.training.loop import train

    run = tmp_path_factory.mktemp("reference") / "run"
    train(load_config(None, tiny_overrides(corpus, run, **RUN)))
    return run


def _broken_copies(d, corpus, run) -> dict:
    """Copies of the corpus and of the trained run, each broken in one way."""
    f = {}
    for name, change in {
        "no_train": lambda p: (p / "train.bin").unlink(),
        "short_val": lambda p: os.truncate(p / "val.bin", 40),
        "out_of_range": lambda p: (p / "train.bin").write_bytes(np.full(5000, 300, np.uint16).tobytes()),
    }.items():
        f[name] = d / name
        shutil.copytree(corpus, f[name])
        change(f[name])
    f["corrupt"] = d / "corrupt"
    shutil.copytree(run, f["corrupt"])
    for step in ("2", "4"):
        truncate_checkpoint(f["corrupt"] / "checkpoints" / step)
    f["bad_config_run"] = d / "bad_config_run"
    shutil.copytree(run, f["bad_config_run"])
    (f["bad_config_run"] / "config.toml").write_text("[model\n")
    f["no_checkpoint"] = d / "no_checkpoint"
    f["no_checkpoint"].mkdir()
    shutil.copy(run / "config.toml", f["no_checkpoint"])
    f["ckpt_file_run"] = d / "ckpt_file_run"  # checkpoints/ cannot be created: a file holds its name
    f["ckpt_file_run"].mkdir()
    (f["ckpt_file_run"] / "checkpoints").write_text("not a directory")
    f["edited"] = d / "edited"  # config.toml edited after the checkpoints were saved
    shutil.copytree(run, f["edited"])
    (f["edited"] / "config.toml").write_text((run / "config.toml").read_text().replace("d_model = 32", "d_model = 64"))
    return f


@pytest.fixture(scope="session")
def files(corpus, tmp_path_factory) -> Iterator[dict[str, str]]:
    """The broken inputs the bad-invocation table refers to, and a small trained run (checkpoints 2 and 4)."""
    from jaxlm.data.bpe import train_and_save
    from jaxlm.data.prepare import prepare
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("bad_inputs")
    run = d / "run"
    train(load_config(None, tiny_overrides(corpus, run, **{"train.steps": 4, "checkpoint.every": 2,
                                                           "log.tensorboard": "false"})))
    f = {"tmp": d, "run": run, "corpus": corpus, "file": d / "a_file", "bad_toml": d / "bad.toml",
         "text": d / "text.txt", "bad_utf8": d / "bad_utf8.txt", "empty": d / "empty.txt",
         "bad_plan": d / "bad_plan.toml", **_broken_copies(d, corpus, run)}
    f["file"].write_text("not a directory")
    f["bad_toml"].write_text("[model\nd_model = ")
    f["text"].write_text("a little text to tokenise\n" * 50)
    f["bad_utf8"].write_bytes(b"\xff\xfe not utf-8")
    f["empty"].write_text("")
    f["bad_plan"].write_text('[[runs]]\nname = "x"\nbogus = 1\n')
    f["bpe"], f["bpe_data"] = d / "bpe", d / "bpe_data"  # same vocabulary size, other ids
    train_and_save([corpus / "corpus.txt"], 257, ["<|endoftext|>"], f["bpe"], progress=False)
    prepare([corpus / "corpus.txt"], str(f["bpe"]), f["bpe_data"], progress=False)
    f["locked"], f["locked_run"], f["locked_runs"] = d / "locked", d / "locked_run", d / "locked_runs"
    shutil.copytree(run, f["locked_run"])
    f["lock_plan"] = d / "lockplan.toml"
    f["lock_plan"].write_text('[defaults]\nkind = "command"\nargv = ["{python}", "-c", "pass"]\n'
                              '[[runs]]\nname = "one"\n')
    holder = hold_locks(f["locked"], f["locked_run"], f["locked_runs"] / "lockplan")  # another live writer
    yield {k: str(v) for k, v in f.items()}
    holder.kill()
    holder.wait()
