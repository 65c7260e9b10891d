"""Checkpoints with orbax: the train state, the data position and the run's identity.

Run directory layout (everything `jaxlm.generate` needs, no flags):

    RUN/config.toml              the resolved config (`load_config(RUN/config.toml)` rebuilds it)
    RUN/tokenizer/              the token files' meta.json (names the tokenizer) + its vocab/merges copy
    RUN/checkpoints/<step>/state the train state: step, params, optimizer state, model RNG
    RUN/checkpoints/<step>/meta  JSON: step, data position, seed, val loss if known

The data loader's batch of global step s is a pure function of (seed, s), so the
data position is the step itself. Orbax writes each step to a temporary directory
and renames it when complete, so a killed run leaves its last complete checkpoint
usable. Saving is asynchronous; `close()` waits for it. Restores go against an
abstract target (shapes, dtypes, shardings), never into plain dicts.

PRNG key arrays (dropout streams) are stored as their raw uint32 key data.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from jaxlm.config import CheckpointConfig, Config, dumps_toml, load_config, to_dict
from jaxlm.step import TrainState, build_model, split_model


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def to_savable(state):
    """Typed PRNG keys -> uint32 key data (orbax stores plain arrays)."""
    return jax.tree.map(lambda a: jax.random.key_data(a) if _is_key(a) else a, state)


def abstract_savable(abstract_state):
    """The shape/dtype/sharding target matching `to_savable(state)` for a `jax.eval_shape`d state."""

    def one(a):
        sharding = getattr(a, "sharding", None)
        if _is_key(a):
            data = jax.eval_shape(jax.random.key_data, a)
            return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=_replicated_like(sharding))
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)

    return jax.tree.map(one, abstract_state)


def _replicated_like(sharding):
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return sharding


def from_savable(saved, like):
    """Inverse of `to_savable`, guided by a state (or abstract state) with typed keys."""
    return jax.tree.map(lambda s, l: jax.random.wrap_key_data(s) if _is_key(l) else s, saved, like)


class Checkpointer:
    """An orbax CheckpointManager for RUN/checkpoints with the run's keep / keep-best policy."""

    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig):
        self.dir = Path(run_dir).absolute() / "checkpoints"
        policies = [pp.LatestN(n=cfg.keep)]
        if cfg.keep_best:
            policies.append(
                pp.BestN(get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1, keep_checkpoints_without_metrics=False)
            )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies) if len(policies) > 1 else policies[0],
            enable_async_checkpointing=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.dir, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, meta: dict, val_loss: float | None = None) -> None:
        step = int(meta["step"])
        if step in self.manager.all_steps():
            return
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(to_savable(state.as_dict())), meta=ocp.args.JsonSave(meta)
            ),
            metrics={"val_loss": float(val_loss)} if val_loss is not None else None,
            force=True,
        )

    def restore(self, abstract_state: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        step = self.manager.latest_step() if step is None else step
        target = abstract_state.as_dict()
        out = self.manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_savable(target)), meta=ocp.args.JsonRestore()),
        )
        return TrainState(**from_savable(out["state"], target)), dict(out["meta"])

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def write_run_files(run_dir: str | Path, cfg: Config, data_dir: str | Path) -> None:
    """RUN/config.toml (resolved) and RUN/tokenizer/meta.json (from the token files)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dumps_toml(to_dict(cfg)))
    meta = Path(data_dir) / "meta.json"
    if meta.is_file():
        (run_dir / "tokenizer").mkdir(exist_ok=True)
        for name in ["meta.json", *json.loads(meta.read_text()).get("tokenizer_files", [])]:
            shutil.copyfile(Path(data_dir) / name, run_dir / "tokenizer" / name)


def find_run_dir(path: str | Path) -> tuple[Path, int | None]:
    """A run dir, its checkpoints dir, or one step's dir -> (run dir, step or None for latest)."""
    path = Path(path).absolute()
    for candidate, step in ((path, None), (path.parent, None), (path.parent.parent, path.name)):
        if (candidate / "config.toml").is_file():
            return candidate, int(step) if step is not None and str(step).isdigit() else None
    raise FileNotFoundError(f"no config.toml in {path} or its parents: not a jaxlm run directory")


def restore_for_inference(run_or_ckpt_dir: str | Path, step: int | None = None):
    """(model, cfg, tokenizer) from a run directory (or a checkpoint inside one), on the default device.

    Only the parameters and model variables are read, not the optimizer state.
    `tokenizer` is None when the run has no tokenizer/meta.json.
    """
    from flax import nnx

    run_dir, found_step = find_run_dir(run_or_ckpt_dir)
    step = step if step is not None else found_step
    cfg = load_config(run_dir / "config.toml")
    abstract = nnx.eval_shape(lambda: build_model(cfg.model, cfg.compute, cfg.train.seed))
    graphdef, params, rest = split_model(abstract)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"params": params, "rest": rest}
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), target)
    manager = ocp.CheckpointManager(Path(run_dir).absolute() / "checkpoints", item_names=("state", "meta"))
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{run_dir}/checkpoints holds no checkpoint")
    saved = abstract_savable(target)
    out = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=saved, restore_args=ocp.checkpoint_utils.construct_restore_args(saved), partial_restore=True
            )
        ),
    )
    manager.close()
    restored = from_savable(out["state"], target)
    model = nnx.merge(graphdef, restored["params"], restored["rest"])
    tokenizer = None
    if (run_dir / "tokenizer" / "meta.json").is_file():
        from jaxlm.data.prepare import load_tokenizer_from_meta

        tokenizer = load_tokenizer_from_meta(run_dir / "tokenizer")
    return model, cfg, tokenizer
