"""What orbax needs around it: PRNG key arrays stored as their raw uint32 key data (orbax stores plain arrays), a
failed write's cause in words, orbax's own log kept off the terminal, and the newest checkpoint of a directory that
restores (jaxlm.training.checkpoint is built on these).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable

import jax

from jaxlm.core.errors import CheckpointError


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


def log_orbax_to(path: Path) -> Callable[[], None]:
    """Route orbax's log (absl) to `path` instead of the terminal; returns the undo. A failed save logs a
    page of traceback per background thread; the failure itself is the one WriteFailed line."""
    logger = logging.getLogger("absl")
    handler = logging.FileHandler(path, delay=True)  # the file is created by the first record
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("--- %(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.handleError = lambda record: None  # a full disk refuses the log too: the WriteFailed line says why
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False

    def undo() -> None:
        logger.removeHandler(handler)
        handler.close()
        logger.propagate = propagate

    return undo


def first_line(e: BaseException, limit: int = 160) -> str:
    """The exception's first sentence: TensorStore appends a page of its spec to the first line."""
    line = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
    return f"{type(e).__name__}: {line.split('. See ')[0][:limit]}"


def mute_failed_reads() -> None:
    """When a restore fails, orbax's other pending reads of that checkpoint fail too, during and after
    it, one page of traceback each, through `sys.unraisablehook` and the asyncio logger: drop those
    (the failure itself is reported by `restore_newest`)."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    previous = sys.unraisablehook
    if getattr(previous, "jaxlm_mute", False):
        return

    def hook(u):
        code = getattr(u.object, "cr_code", None)
        from_orbax = code is not None and "orbax" in code.co_filename
        loop_closed = isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed"
        if not (from_orbax or loop_closed):
            previous(u)

    hook.jaxlm_mute = True
    sys.unraisablehook = hook


def restore_newest(directory: Path, steps, restore_one: Callable[[int], Any]) -> tuple[int, Any, list[int]]:
    """(step, restore_one(step), newer steps that failed) for the newest of `steps` that restores;
    each failure is a warning line. One CheckpointError line when none restores."""
    failed, error = [], None
    mute_failed_reads()
    for step in sorted(steps, reverse=True):
        try:
            return step, restore_one(step), failed
        except Exception as e:  # orbax and TensorStore raise many kinds for a damaged checkpoint
            failed.append(step)
            error = error or e
            print(f"warning: {directory}/{step} does not restore ({first_line(e)}); skipped", file=sys.stderr)
    tried = ", ".join(map(str, failed)) or "none saved"
    raise CheckpointError(f"{directory}: no checkpoint restores (steps tried: {tried}; newest failed with "
                          f"{first_line(error) if error else 'nothing to restore'}); check that the config matches "
                          "the run's config.toml, or move the directory away to start again")
