"""Full disks and too little memory: a failed checkpoint save or prepare ends in one line, the preflight refuses
a disk without room for a checkpoint and a batch that does not fit, naming the largest that does."""

from __future__ import annotations

import re
import subprocess

import pytest

from jaxlm.core.config import load_config
from jaxlm.core.errors import ConfigError
from tests.system.fault_helpers import HELPERS, PY, sets
from tests.train_helpers import env, tiny_overrides

# --------------------------------------------------------------------------- failed saves, full disks


def _limited(max_bytes: int, module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m module args` unable to write a file past max_bytes (RLIMIT_FSIZE: a full disk, for one process)."""
    return subprocess.run([PY, HELPERS, "file-size-limit", str(max_bytes), module, *args], env=env(),
                          capture_output=True, text=True, timeout=300)


def test_a_failed_checkpoint_save_ends_in_one_line_without_hanging(corpus, tmp_path):
    """A full disk (a file size limit): exit 1 within the timeout, one line naming checkpoints/ and the cause,
    orbax's tracebacks only in RUN/error.log. d_model 512 makes one array (the 257 x 512 embedding, 526 KB) larger
    than the limit, so the first save fails however orbax groups its arrays into files (a 37k-parameter state
    can fit in files under the limit)."""
    run = tmp_path / "run"
    extra = {"train.steps": 4, "checkpoint.every": 2, "model.d_model": 512}
    r = _limited(200_000, "jaxlm.train", sets(tiny_overrides(corpus, run, **extra)))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(rf"{re.escape(str(run))}/checkpoints: saving checkpoint 2 failed: File too large", errors[0])
    assert "Traceback" in (run / "error.log").read_text()


def test_preflight_refuses_a_disk_without_room_for_one_checkpoint(corpus, tmp_path, monkeypatch):
    import shutil as sh

    from jaxlm.training import preflight
    from jaxlm.training.loop import train

    usage = sh.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=100_000))
    with pytest.raises(ConfigError, match=r"train.out_dir = .*: its file system has 0.1 MiB free, one checkpoint of "
                                          r"this run takes 0.4 MiB"):
        train(load_config(None, tiny_overrides(corpus, tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_a_full_disk_during_prepare_names_the_file_and_the_cause(tmp_path):
    text, out = tmp_path / "text.txt", tmp_path / "data"
    text.write_text("some text to tokenise\n" * 40_000)
    r = _limited(300_000, "jaxlm.data", ["prepare", "--input", str(text), "--tokenizer", "bytes", "--out", str(out)])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0].startswith(f"error: {out}/train.bin: preparing the data failed: File too large")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]  # no half-written data, no lock left

# --------------------------------------------------------------------------- memory


def test_memory_preflight_names_the_batch_and_the_largest_that_fits(corpus, tmp_path, monkeypatch):
    """With less memory than the compiled step needs: refused before any state exists, naming
    data.batch_size, the figure and a batch whose compiled step does fit."""
    import jax

    from jaxlm.analysis.flops import param_counts
    from jaxlm.core import sharding
    from jaxlm.training import loop as loop_lib
    from jaxlm.training import preflight

    cfg = load_config(None, tiny_overrides(corpus, tmp_path / "run", **{"data.batch_size": 64}))
    mesh = sharding.make_mesh(cfg=cfg.parallel)

    def needed(cfg):
        b = loop_lib.build(cfg, mesh)
        x = jax.ShapeDtypeStruct((cfg.data.batch_size, cfg.model.context_length), jax.numpy.int32,
                                 sharding=sharding.batch_sharding(mesh))
        m = b.step_fn.lower(b.abstract, x, x).compile().memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes

    have = needed(cfg) // 3
    monkeypatch.setattr(preflight, "available_memory", lambda: (have, "this test device has"))
    with pytest.raises(ConfigError, match=r"data.batch_size = 64: the compiled train step needs .* per device .* "
                                          r"but this test device has .*; about (\d+) fits") as e:
        loop_lib.train(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was created
    fits = int(str(e.value).split("about ")[1].split(" ")[0])
    assert 1 <= fits < 64
    assert needed(load_config(None, tiny_overrides(corpus, tmp_path / "run", **{"data.batch_size": fits}))) <= have
    weights = param_counts(cfg.model)["total"] * 4 * 2  # float32 (and RoPE tables): the parameters fit, Adam does not
    monkeypatch.setattr(preflight, "available_memory", lambda: (weights, "this test device has"))
    with pytest.raises(ConfigError, match=r"model.d_model = 32, model.num_layers = 2 .*so no batch fits"):
        loop_lib.train(cfg)
    monkeypatch.setattr(preflight, "available_memory", lambda: (1000, "this test device has"))
    with pytest.raises(ConfigError, match=r"model.d_model = 32, .* parameters take 0.1 MiB before any optimizer "
                                          r"state or activation, but this test device has 0.0 MiB"):
        loop_lib.train(cfg)
