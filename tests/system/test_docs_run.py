"""The documented commands that run for real, at a smoke size, from a scratch directory holding the configs, and
every documented command's --help without torch (the parsing of every command: test_docs_commands.py)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system.test_docs_commands import ALL, HELPED, REPO
from tests.train_helpers import needs

# The commands run for real, in order (a later one may use an earlier one's run): doc command -> what the smoke
# run appends. The training shrink keeps every phase (evaluation, sample, checkpoint) at a few steps.
SHRINK = ["--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "data.eval_tokens=1024",
          "--set", "log.every=2", "--set", "log.sample_tokens=8", "--set", "checkpoint.every=4",
          "--set", "train.steps_per_call=1", "--set", "log.progress=false"]
# The quick start on tiny Shakespeare (it reads the corpus: skipped, naming the download, without it), then the rest.
SMOKE_SHAKESPEARE = {
    "python -m jaxlm.train --config experiments/configs/shakespeare_char.toml": SHRINK,
    'python -m jaxlm.generate --run runs/shakespeare_char --prompt "ROMEO:"': ["--max-new-tokens", "8"],
}
# The GPU quick start, compiled for a GPU here (the gpu-compile extra).
SMOKE_GPU_COMPILE = {
    "python -m jaxlm.bench model --target h100-80gb --config experiments/configs/shakespeare_char_gpu.toml "
    "--context 256 --batch 64 --mode train_step": [],
}
SMOKE = {
    "python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb": [],
    "python -m experiments.run lr_sweep --dry-run": [],
    "python -m deliverables.gpu --dry-run": [],
}


def _run_smoke(commands: dict[str, list[str]], tmp_path: Path, data_root: Path) -> None:
    """The commands, as written plus their shrink, from a scratch directory holding the configs."""
    documented = {c.text: c for c in ALL}
    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    env = {**os.environ, "JAXLM_DATA": str(data_root),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    for text, extra in commands.items():
        key = shlex.join(shlex.split(text))
        assert key in documented, f"{text}: no longer in the docs; update SMOKE"
        argv = [sys.executable, *shlex.split(text)[1:], *extra]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{documented[key].where} {text}: {proc.stderr[-600:]}"


@pytest.mark.slow
def test_smoke_commands_run(tmp_path):
    _run_smoke(SMOKE, tmp_path, tmp_path / "no-data")


@needs("gpu-compile")
def test_gpu_quick_start_compiles_for_a_gpu(tmp_path):
    _run_smoke(SMOKE_GPU_COMPILE, tmp_path, tmp_path / "no-data")


@pytest.mark.slow
def test_shakespeare_quick_start_runs(tmp_path, tinyshakespeare):
    _run_smoke(SMOKE_SHAKESPEARE, tmp_path, tinyshakespeare.parent)


HELP_OF_EACH = """
import contextlib, io, runpy, site, sys
site.addsitedir(sys.argv[1])  # the install's packages but torch (python -S: no site-packages of its own)
failed = []
for word in sys.argv[2:]:
    module, *sub = word.split()
    sys.argv, out = [module, *sub, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code in (0, None) and out.getvalue().strip():
            continue
    failed.append(f"{word}: {out.getvalue().strip()[-300:]}")
print("\\n".join(failed))
"""


def test_every_command_takes_help_without_torch(tmp_path):
    """`--help` works on every install (a command that needs torch says so in it, and stops only when run): each
    documented command's --help, in a Python that sees this install's packages except torch's."""
    import sysconfig

    site_packages = Path(sysconfig.get_paths()["purelib"])
    for entry in site_packages.iterdir():
        if not re.match(r"(torch|functorch|torchgen)\b", entry.name):
            (tmp_path / entry.name).symlink_to(entry)
    words = [" ".join(w) for w in HELPED]
    out = subprocess.run([sys.executable, "-S", "-c", HELP_OF_EACH, str(tmp_path), *words], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr[-2000:]
