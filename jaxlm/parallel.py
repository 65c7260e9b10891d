"""Device mesh, shardings and multi-host start-up: sharding as data, in one place.

One mesh axis, ``data``, over every device of every process (`jax.devices()`):
  * the global batch is split along its batch dimension over ``data``;
  * parameters and optimizer state are replicated, or with ``parallel.fsdp`` each
    array is split over ``data`` along its largest dimension divisible by the
    number of devices (arrays with no such dimension, and scalars, stay replicated).
XLA inserts the gradient all-reduce (or reduce-scatter / all-gather for FSDP).

Several hosts: `maybe_initialize_distributed` calls `jax.distributed.initialize`
with the coordinator from the config, or lets JAX read it from the environment
(Slurm is detected automatically; otherwise JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES, JAX_PROCESS_ID). Each process loads its own slice of the
global batch and `global_batch` stitches the slices together.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxlm.config import ParallelConfig
from jaxlm.errors import ConfigError

DATA = "data"


def maybe_initialize_distributed(cfg: ParallelConfig) -> None:
    """Start jax.distributed when asked to (config) or when the environment says so."""
    if not cfg.distributed:
        return
    if getattr(jax.distributed, "is_initialized", lambda: False)():
        return
    # CPU collectives across processes need gloo (the default CPU client has none); GPUs ignore this.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if cfg.coordinator:
        kwargs["coordinator_address"] = cfg.coordinator
    if cfg.num_processes is not None:
        kwargs["num_processes"] = cfg.num_processes
    if cfg.process_id is not None:
        kwargs["process_id"] = cfg.process_id
    jax.distributed.initialize(**kwargs)


def make_mesh(devices=None) -> Mesh:
    """A 1-D ``data`` mesh over `devices` (default: all), ordered by process so each host owns a contiguous block."""
    devices = sorted(devices or jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (DATA,))


def fsdp_spec(shape: tuple[int, ...], n: int) -> P:
    """Shard the largest dimension divisible by n (ties: the first); replicate if none."""
    best = None
    for i, size in enumerate(shape):
        if size % n == 0 and size >= n and (best is None or size > shape[best]):
            best = i
    if best is None or n == 1:
        return P()
    return P(*[DATA if i == best else None for i in range(len(shape))])


def state_shardings(abstract_state, mesh: Mesh, fsdp: bool):
    """A NamedSharding per leaf of a (shape-only) state tree."""
    n = mesh.shape[DATA]

    def one(leaf):
        shape = tuple(getattr(leaf, "shape", ()))
        return NamedSharding(mesh, fsdp_spec(shape, n) if fsdp else P())

    return jax.tree.map(one, abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """(batch, seq) arrays split along the batch."""
    return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
    """(steps, batch, seq) stacks of batches split along the batch."""
    return NamedSharding(mesh, P(None, DATA))


def global_batch(local: np.ndarray, mesh: Mesh, stacked: bool = False) -> jax.Array:
    """This process's rows (B / process_count, T) -> the global (B, T) array sharded over ``data``
    (stacked: (n, B / process_count, T) -> (n, B, T))."""
    sharding = stacked_batch_sharding(mesh) if stacked else batch_sharding(mesh)
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    axis = 1 if stacked else 0
    global_shape = tuple(n * jax.process_count() if i == axis else n for i, n in enumerate(local.shape))
    return jax.make_array_from_process_local_data(sharding, local, global_shape)


def check_batch(batch_size: int, grad_accum: int, mesh: Mesh) -> None:
    """Each micro-batch must split evenly over the devices, and the batch over the processes."""
    n, processes = mesh.shape[DATA], jax.process_count()
    micro = batch_size // grad_accum
    if micro % n:
        raise ConfigError(
            f"data.batch_size = {batch_size}: {micro} sequences per micro-batch (data.batch_size / train.grad_accum "
            f"= {batch_size} / {grad_accum}) do not divide over {n} devices; use a multiple of {n * grad_accum}"
        )
    if batch_size % processes:
        raise ConfigError(f"data.batch_size = {batch_size}: does not divide over {processes} processes")
