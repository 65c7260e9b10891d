"""One writer per run: a second writer is refused, a dead holder's lock is taken over."""

from __future__ import annotations

import pytest

from jaxlm.core.config import load_config
from jaxlm.core.errors import DirectoryInUse
from tests.train_helpers import hold_locks, tiny_overrides

# --------------------------------------------------------------------------- one writer per run


def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(corpus, tmp_path, capfd):
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(corpus, run, **{"train.steps": 2, "log.tensorboard": "false"}))
    holder = hold_locks(run)
    try:
        with pytest.raises(DirectoryInUse, match=f"train.out_dir = '{run}': in use by pid {holder.pid} on host "):
            train(cfg)
        assert not run.exists()  # refused before anything was created
    finally:
        holder.kill()
        holder.wait()
    capfd.readouterr()
    assert train(cfg)["step"] == 2  # the killed holder's lock is stale: taken over
    assert f"took over the lock of pid {holder.pid}" in capfd.readouterr().err
    assert not (tmp_path / ".run.lock").exists()  # released at the end
