"""Device mesh, logical-axis sharding rules and multi-host start-up: sharding as data, in one place.

The mesh has four named axes, sized by ``parallel.data/fsdp/tensor/pipeline`` (one may be
-1: the devices the others leave): ``data`` x ``pipeline`` x ``fsdp`` x ``tensor``, over
every device of every process, ordered by process so each host owns a contiguous block.

Every parameter carries logical axis names (``nnx.Param(..., logical=("heads", "embed"))``,
set in the model); `RULES`, the one table, maps each logical name to mesh axes, separately
for parameters (which FSDP shards along ``embed``) and for activations (whose batch
stays split over ``data`` and ``fsdp``). XLA's SPMD partitioner then inserts the
collectives: the gradient all-reduce (data), all-gather / reduce-scatter (fsdp),
one all-reduce per sub-layer (tensor). A dimension that does not divide over its mesh
axes stays whole (the vocabulary of 257 byte tokens over tensor = 4, say).

Several hosts: `maybe_initialize_distributed` calls `jax.distributed.initialize` with the
coordinator from the config, or lets JAX read it from the environment (Slurm is detected
automatically; otherwise JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
Each process loads its own slice of the global batch and `global_batch` stitches them.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxlm.core.config import MESH_AXES, Config, ModelConfig, ParallelConfig
from jaxlm.core.errors import ConfigError

DATA, FSDP, TENSOR, PIPELINE = "data", "fsdp", "tensor", "pipeline"
MESH_ORDER = (DATA, PIPELINE, FSDP, TENSOR)  # outermost (across hosts) to innermost (fastest links)
BATCH_AXES = (DATA, FSDP)  # the batch is split over both: FSDP is data parallelism with sharded state

# logical name -> (mesh axes of a parameter dimension, mesh axes of an activation dimension)
RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "batch": ((), BATCH_AXES),
    "seq": ((), ()),
    "vocab": ((TENSOR,), (TENSOR,)),
    "embed": ((FSDP,), ()),
    "heads": ((TENSOR,), (TENSOR,)),
    "kv_heads": ((TENSOR,), (TENSOR,)),  # grouped-query key/value heads: a shard keeps its query heads' group
    "head_dim": ((), ()),
    "mlp": ((TENSOR,), (TENSOR,)),
    "norm": ((), ()),
    "layers": ((PIPELINE,), ()),  # the stacked (scanned) layers: stage s holds its L / pipeline of them
}


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


# --------------------------------------------------------------------------- the mesh


def mesh_shape(cfg: ParallelConfig, n_devices: int) -> dict[str, int]:
    """Axis name -> size, the -1 resolved; the product must be the device count (ConfigError naming the keys)."""
    sizes = {k: getattr(cfg, k) for k in MESH_AXES}
    known = math.prod(v for v in sizes.values() if v != -1)
    free = [k for k, v in sizes.items() if v == -1]
    given = ", ".join(f"parallel.{k} = {v}" for k, v in sizes.items())
    if free:
        if n_devices % known:
            raise ConfigError(f"{given}: the fixed axes ({known} devices) do not divide the {n_devices} devices")
        sizes[free[0]] = n_devices // known
    if math.prod(sizes.values()) != n_devices:
        raise ConfigError(f"{given}: the mesh has {math.prod(sizes.values())} devices but there are {n_devices}; "
                          "make the product equal the device count, or set one axis to -1")
    return sizes


def make_mesh(devices=None, cfg: ParallelConfig | None = None) -> Mesh:
    """The data x pipeline x fsdp x tensor mesh over `devices` (default: all), ordered by process."""
    devices = sorted(devices or jax.devices(), key=lambda d: (d.process_index, d.id))
    sizes = mesh_shape(cfg or ParallelConfig(), len(devices))
    shape = tuple(sizes[a] for a in MESH_ORDER)
    return Mesh(np.array(devices).reshape(shape), MESH_ORDER, axis_types=(AxisType.Auto,) * len(MESH_ORDER))


def batch_size_over(mesh: Mesh) -> int:
    """How many ways the batch is split (data x fsdp)."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_layout(cfg: Config, mesh: Mesh) -> None:
    """A run's model and batch split over `mesh` (each check a ConfigError naming its key): heads and d_ff over
    ``tensor``, whole layers over the pipeline stages, every micro-batch over data x fsdp."""
    micro = cfg.data.batch_size // cfg.train.grad_accum
    check_model(cfg.model, mesh)
    check_pipeline(cfg.model, cfg.compute.scan_layers, cfg.parallel.microbatches, micro, mesh)
    check_batch(cfg.data.batch_size, cfg.train.grad_accum, mesh)


def check_model(cfg: ModelConfig, mesh: Mesh) -> None:
    """Tensor parallelism splits whole heads (query and key/value: a shard holds whole groups of grouped-query
    attention) and d_ff columns: each must divide over ``tensor``."""
    t = mesh.shape[TENSOR]
    for key, value in (("num_heads", cfg.num_heads), ("num_kv_heads", cfg.kv_heads), ("d_ff", cfg.d_ff)):
        if value % t:
            raise ConfigError(f"model.{key} = {value}: does not divide over parallel.tensor = {t}")


def check_pipeline(cfg: ModelConfig, scan_layers: bool, microbatches: int, batch_size: int, mesh: Mesh) -> None:
    """Pipeline stages hold whole layers of the stacked (scanned) layout; micro-batches split every device's rows."""
    p = mesh.shape[PIPELINE]
    if p == 1:
        return
    if not scan_layers:
        raise ConfigError(f"parallel.pipeline = {p}: needs compute.scan_layers = true "
                          "(stages split the stacked layers)")
    if cfg.num_layers % p:
        raise ConfigError(f"model.num_layers = {cfg.num_layers}: does not divide over parallel.pipeline = {p}")
    if batch_size % (microbatches * batch_size_over(mesh)):
        raise ConfigError(f"parallel.microbatches = {microbatches}: data.batch_size = {batch_size} must divide into "
                          f"{microbatches} micro-batches of a multiple of {batch_size_over(mesh)} rows (data x fsdp)")


def check_batch(batch_size: int, grad_accum: int, mesh: Mesh) -> None:
    """Each micro-batch must split evenly over data x fsdp, and the batch over the processes."""
    n, processes = batch_size_over(mesh), jax.process_count()
    micro = batch_size // grad_accum
    if micro % n:
        raise ConfigError(
            f"data.batch_size = {batch_size}: {micro} sequences per micro-batch (data.batch_size / train.grad_accum "
            f"= {batch_size} / {grad_accum}) do not divide over {n} devices (parallel.data x parallel.fsdp); "
            f"use a multiple of {n * grad_accum}"
        )
    if batch_size % processes:
        raise ConfigError(f"data.batch_size = {batch_size}: does not divide over {processes} processes")


# --------------------------------------------------------------------------- logical axes -> specs


def logical_spec(names, shape, mesh_sizes: dict[str, int], activation: bool = False) -> P:
    """Logical names of each dimension -> a PartitionSpec; a dimension that does not divide stays whole."""
    out, used = [], set()
    for name, size in zip(names, shape):
        axes = tuple(a for a in RULES[name][activation] if mesh_sizes.get(a, 1) > 1 and a not in used)
        if axes and size % math.prod(mesh_sizes[a] for a in axes) == 0:
            used.update(axes)
            out.append(axes[0] if len(axes) == 1 else axes)
        else:
            out.append(None)
    return P(*out)


def _variable_spec(var, mesh_sizes) -> P:
    names = var.get_metadata().get("logical")
    shape = tuple(getattr(var, "shape", ()))
    if names is None or len(names) != len(shape):
        return P()
    return logical_spec(names, shape, mesh_sizes)


def state_shardings(abstract_state, mesh: Mesh):
    """A NamedSharding per leaf of a (shape-only) state tree: parameters and their AdamW moments by
    their logical axes, everything else (step, counts, RoPE tables, RNG) replicated."""
    sizes = dict(mesh.shape)

    def one(x):
        if isinstance(x, nnx.Variable):
            return x.replace(NamedSharding(mesh, _variable_spec(x, sizes)))
        return NamedSharding(mesh, P())

    return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def constrain(x: jax.Array, *names: str) -> jax.Array:
    """Pin activation `x` to the sharding of its logical axes under the current mesh (no mesh: x)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or math.prod(mesh.shape.values()) == 1:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, dict(mesh.shape), activation=True))


def on_mesh(fn, mesh: Mesh):
    """`fn` (a jitted function) traced and run with `mesh` current, so `constrain` sees it."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with jax.set_mesh(mesh):
            return fn(*args, **kwargs)

    def lower(*args, **kwargs):
        with jax.set_mesh(mesh):
            return fn.lower(*args, **kwargs)

    call.lower = lower
    return call


# --------------------------------------------------------------------------- batches


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """(batch, seq) arrays split along the batch over data x fsdp."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
    """(steps, batch, seq) stacks of batches split along the batch."""
    return NamedSharding(mesh, P(None, BATCH_AXES))


def global_batch(local: np.ndarray, mesh: Mesh, stacked: bool = False) -> jax.Array:
    """This process's rows (B / process_count, T) -> the global (B, T) array split along the batch
    (stacked: (n, B / process_count, T) -> (n, B, T))."""
    sharding = stacked_batch_sharding(mesh) if stacked else batch_sharding(mesh)
    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    axis = 1 if stacked else 0
    global_shape = tuple(n * jax.process_count() if i == axis else n for i, n in enumerate(local.shape))
    return jax.make_array_from_process_local_data(sharding, local, global_shape)
