"""Locks of one directory (issue 36, item 8; issue 46, item 15): one writer per run (a second refused, naming the
directory and the holder's program, a dead holder's lock taken over), one location whatever the permissions, a lock
naming another host refused until its file is deleted, readers beside readers and none needed on a read-only run
(quantize, lora merge and hf export only read one), a lock file that cannot be made refused with its real cause."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest

from jaxlm.core.config import load_config
from jaxlm.core.errors import DirectoryInUse
from jaxlm.core.lock import DirLock, lock_path
from tests.system.fault_helpers import PY
from tests.train_helpers import ROOT, env, hold_locks, make_corpus, needs, tiny_overrides

# --------------------------------------------------------------------------- one writer per run


def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(corpus, tmp_path, capfd):
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(corpus, run, **{"train.steps": 2, "log.tensorboard": "false"}))
    holder = hold_locks(run)
    try:
        with pytest.raises(DirectoryInUse, match=f"train.out_dir = '{run}': {run} is in use by pid {holder.pid} on "):
            train(cfg)
        assert not run.exists()  # refused before anything was created
    finally:
        holder.kill()
        holder.wait()
    capfd.readouterr()
    assert train(cfg)["step"] == 2  # the killed holder's lock is stale: taken over
    assert f"took over the lock of pid {holder.pid}" in capfd.readouterr().err
    assert not (tmp_path / ".run.lock").exists()  # released at the end


# --------------------------------------------------------------------------- where the lock is, whose it is


def test_one_lock_location_whatever_the_permissions(tmp_path, monkeypatch):
    """A parent this process cannot write used to move the lock into the directory (DIR/.lock), so a process
    with other rights took another lock on the same run."""
    run = tmp_path / "run"
    run.mkdir()
    writable = lock_path(run)
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: str(p) != str(tmp_path))
    assert lock_path(run) == writable == tmp_path / ".run.lock"


def test_a_lock_naming_another_host_is_refused_until_deleted(tmp_path, capsys):
    run = tmp_path / "run"
    path = lock_path(run)
    path.write_text(json.dumps({"host": "elsewhere-7", "pid": 4711, "command": "python -m jaxlm.train",
                                "since": "2026-01-01T00:00:00"}))
    with pytest.raises(DirectoryInUse, match=r"pid 4711 on host elsewhere-7.*delete .*\.run\.lock"):
        DirLock(run, "train.out_dir = 'run'").acquire()
    assert json.loads(path.read_text())["host"] == "elsewhere-7"  # left as it was
    path.unlink()  # the override: the user says that process is gone
    with DirLock(run, "train.out_dir = 'run'"):
        assert json.loads(path.read_text())["host"] == socket.gethostname()
    assert not path.exists()
    stale = {"host": socket.gethostname(), "pid": 4712, "command": "x", "since": "2026-01-01T00:00:00"}
    path.write_text(json.dumps(stale))  # this host's dead holder: taken over with a warning, as before
    with DirLock(run, "train.out_dir = 'run'"):
        pass
    assert "took over the lock of pid 4712" in capsys.readouterr().err


def test_readers_share_a_lock_that_a_writer_waits_for(tmp_path):
    run = tmp_path / "run"
    with DirLock(run, "a", shared=True), DirLock(run, "b", shared=True):
        with pytest.raises(DirectoryInUse, match="reading it"):
            DirLock(run, "train.out_dir = 'run'").acquire()
    with DirLock(run, "train.out_dir = 'run'"):
        with pytest.raises(DirectoryInUse, match=f"pid {os.getpid()}"):
            DirLock(run, "reader", shared=True).acquire()
    assert not lock_path(run).exists()


def _read_only(*paths) -> list[str]:
    """A shell prefix that runs a command with `paths` bind-mounted read-only (a user namespace: no root needed,
    and read-only even for root, which permission bits are not)."""
    mounts = " && ".join(f"mount --bind {p} {p} && mount -o remount,bind,ro {p}" for p in paths)
    return ["unshare", "-rm", "sh", "-c", f'{mounts} && exec "$@"', "sh"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("locks")
    corpus = make_corpus(d / "corpus")
    run = d / "runs" / "lora"
    train(load_config(None, tiny_overrides(corpus, run, **{"train.steps": 2, "checkpoint.every": 2,
                                                           "log.tensorboard": "false", "lora.rank": 2})))
    return run


def test_quantize_and_lora_merge_read_a_read_only_run(lora_run, tmp_path):
    if shutil.which("unshare") is None or subprocess.run(_read_only(tmp_path) + ["true"]).returncode:
        pytest.skip("no user namespaces here (unshare -rm) to mount a read-only run")
    ro = _read_only(lora_run.parent, lora_run.parent.parent / "corpus")
    merged = tmp_path / "merged"
    merge = subprocess.run([*ro, PY, "-m", "jaxlm.lora", "merge", str(lora_run), "--out", str(merged)], env=env(),
                           capture_output=True, text=True, timeout=600)
    assert merge.returncode == 0, merge.stderr[-2000:]
    ro_merged = _read_only(tmp_path, lora_run.parent.parent / "corpus")
    quantize = subprocess.run([*ro_merged, PY, "-m", "jaxlm.quantize", str(merged), "--tokens", "64", "--bits", "8"],
                              env=env(), capture_output=True, text=True, timeout=600)
    assert quantize.returncode == 0 and "int8 (PTQ)" in quantize.stdout, quantize.stderr[-2000:]
    assert not list(lora_run.parent.glob(".*.lock")) and not list(tmp_path.glob(".*.lock"))


@needs("hf")
def test_hf_export_reads_a_read_only_run(lora_run, tmp_path):
    """It took the writer's lock, which a read-only run cannot hold: refused (with ENOENT for the cause)."""
    if shutil.which("unshare") is None or subprocess.run(_read_only(tmp_path) + ["true"]).returncode:
        pytest.skip("no user namespaces here (unshare -rm) to mount a read-only run")
    ro = _read_only(lora_run.parent, lora_run.parent.parent / "corpus")
    export = subprocess.run([*ro, PY, "-m", "jaxlm.hf", "export", str(lora_run), "--out", str(tmp_path / "hf")],
                            env=env(), capture_output=True, text=True, timeout=600)
    assert export.returncode == 0 and (tmp_path / "hf" / "model.safetensors").is_file(), export.stderr[-2000:]
    assert not list(lora_run.parent.glob(".*.lock")) and not list(tmp_path.glob(".*.lock"))


HOLD = "import sys, time; from jaxlm.core.lock import DirLock; DirLock(sys.argv[1], 'x').acquire(); print('held', \
flush=True); time.sleep(600)"


def test_a_refusal_names_the_directory_and_the_real_cause(tmp_path):
    """The line quoted the holder's command cut at 300 characters (a long --set list hid its train.out_dir), and a
    lock file that could not be made gave ENOENT (the read-only retry's) for a read-only file system."""
    run = tmp_path / "runs" / "x"
    holder = subprocess.Popen([PY, "-c", HOLD, str(run), *[f"--set=key{i}=1" for i in range(100)]], env=env(),
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryInUse, match=rf"^--out runs/x: {run} is in use by pid {holder.pid} on host .* "
                                                 r"\(python -c\), which holds") as e:
            DirLock(run, "--out runs/x").acquire()
        assert "key" not in str(e.value)
    finally:
        holder.kill()
        holder.wait()
    if shutil.which("unshare") is None or subprocess.run(_read_only(tmp_path) + ["true"]).returncode:
        pytest.skip("no user namespaces here (unshare -rm) to mount a read-only directory")
    code = "import sys; from jaxlm.core.lock import DirLock; DirLock(sys.argv[1], 'train.out_dir').acquire()"
    r = subprocess.run([*_read_only(tmp_path), PY, "-c", code, str(tmp_path / "ro_run")], env=env(),
                       capture_output=True, text=True, timeout=300)
    assert "cannot create the lock file" in r.stderr and "(Read-only file system)" in r.stderr, r.stderr[-2000:]
