"""What each run executes: the child command of a train, bench or command run, and its overrides."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable

from experiments.plan import RunSpec
from jaxlm.core.config import Config, load_config
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
