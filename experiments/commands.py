"""What a run executes and where: each kind's child command, the device and whether it meets a run's requirement,
and the software and git commit a record names."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from contextlib import suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

from experiments.plan import RunSpec
from jaxlm.core.config import Config, load_config
from jaxlm.core.errors import UsageError
from jaxlm.core.typedconfig import toml_value


def train_overrides(spec: RunSpec, run_dir: Path) -> list[str]:
    """The run's `--set` overrides, with the token budget turned into steps and out_dir pointed at the run."""
    overrides = {**spec.set, "train.out_dir": str(run_dir)}
    if spec.tokens:
        cfg = load_config(spec.config, [f"{k}={toml_value(v)}" for k, v in overrides.items()])
        overrides["train.steps"] = max(1, math.ceil(spec.tokens / (cfg.data.batch_size * cfg.model.context_length)))
    return [f"{k}={toml_value(v)}" for k, v in overrides.items()]


def train_config(spec: RunSpec, run_dir: Path = Path("runs")) -> Config:
    return load_config(spec.config, train_overrides(spec, run_dir))


def bench_overrides(spec: RunSpec) -> list[str]:
    """The model and compute overrides of a bench run: a plan's data/optim/train settings are left
    out, so a bench run in a training plan measures the same model the training runs use."""
    return [f"{k}={toml_value(v)}" for k, v in spec.set.items() if k.startswith(("model.", "compute."))]


def cli_args(args: dict) -> list[str]:
    """{"batch": [4, 8], "find_max_batch": True, "json": "x"} -> --batch 4 8 --find-max-batch --json x."""
    out: list[str] = []
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif isinstance(v, list):
            out += [flag, *map(str, v)]
        elif v is not False and v is not None:
            out += [flag, str(v)]
    return out


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def build_train(spec: RunSpec, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "jaxlm.train", "--config", spec.config, *_sets(train_overrides(spec, run_dir))]


def build_bench(spec: RunSpec, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "jaxlm.bench", "model", *cli_args(spec.args), *_sets(bench_overrides(spec)),
            "--json", str(run_dir / "bench.json")]


def build_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """The run's argv with {run_dir} and {python} filled in, then its args as flags."""
    argv = [a.replace("{run_dir}", str(run_dir)).replace("{python}", sys.executable) for a in spec.argv]
    return argv + cli_args(spec.args)


BUILDERS: dict[str, Callable[[RunSpec, Path], list[str]]] = {"train": build_train, "bench": build_bench,
                                                             "command": build_command}


@dataclass(frozen=True)
class Device:
    platform: str  # cpu | gpu | tpu
    kind: str  # jax.devices()[0].device_kind, "cpu" on CPUs
    count: int


def detect_device() -> Device:
    """Ask JAX in a child process, so this process never initialises (or preallocates on) the accelerator."""
    code = "import jax, json; d = jax.devices(); print(json.dumps([d[0].platform, d[0].device_kind, len(d)]))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
        platform, kind, count = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        print(f"warning: could not query JAX devices ({e}); assuming cpu", file=sys.stderr)
        return Device("cpu", "cpu", 1)
    return Device(platform, "cpu" if platform == "cpu" else kind, count)


def software_versions() -> dict[str, str]:
    """Python and the installed versions of the packages results depend on (absent ones left out)."""
    found = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch"):
        with suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found


def git_info(root: Path | None = None) -> dict:
    """The commit of the tree at `root` (default: here) and whether it differs from it: modified tracked
    files or untracked files git does not ignore (a new plan or module changes what runs)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=30, cwd=root).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain").splitlines()  # "XY path": two status letters, a space, the path
    return {"commit": git("rev-parse", "HEAD").strip() or None, "dirty": bool(changed),
            "changed": [c[3:] for c in changed[:5]]}


def check_committed(git: dict) -> None:
    """Final records come only from a committed tree, so each names the code that produced it."""
    if git["commit"] is None:
        raise UsageError(f"{Path.cwd()}: not a git checkout, so the records could not name their code; run from the "
                         "repository, or pass --draft to record draft runs")
    if git["dirty"]:
        more = ", ..." if len(git["changed"]) == 5 else ""
        raise UsageError(f"{Path.cwd()}: uncommitted changes ({', '.join(git['changed'])}{more}): commit them so "
                         "every record names the code that produced it, or pass --draft to record draft runs")


def unmet_requirement(spec: RunSpec, device: Device) -> str | None:
    """Why the run cannot happen on this device, or None. cuDNN attention implies 'gpu', the only requirement."""
    cudnn = spec.set.get("compute.attention") == "cudnn" or str(spec.args.get("attention", "")) == "cudnn"
    if device.platform == "gpu" or not (spec.requires or cudnn):
        return None
    reason = spec.reason or ("needs an NVIDIA GPU" if spec.requires else
                             "cuDNN flash attention needs an NVIDIA GPU (cuDNN)")
    return f"{reason}; this device is {device.kind} ({device.platform})"
