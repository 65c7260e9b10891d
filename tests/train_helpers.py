"""Shared pieces of the tests: a tiny config, a tiny token corpus, step runners, skips for missing extras, a child
process's environment.

Also runnable as a script for subprocess tests: `python tests/train_helpers.py devices`
(several simulated devices), `python tests/train_helpers.py slow-train DELAY ARGS...`
(`python -m jaxlm.train ARGS...` with each jitted call delayed, so a test can kill it mid-run),
`python tests/train_helpers.py hold-locks DIR...` (holds each directory's lock until killed),
`python tests/train_helpers.py file-size-limit BYTES MODULE ARGS...` (`python -m MODULE ARGS...`
unable to write a file past BYTES: a full disk, without a full disk), `python tests/train_helpers.py signal-at
SIGNAL POINT MODULE ARGS...` (`python -m MODULE ARGS...` sent SIGNAL when POINT is first called: a signal at a
chosen moment, as from outside).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The XLA flags of every test process (tests/conftest.py sets them; a child whose XLA_FLAGS a test sets starts from
# them, so that a result compared with the test's own is compiled alike): XLA:CPU's LLVM optimisations off, as the
# suite's tiny programs compile far longer than they run.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def xla_devices(n: int) -> str:
    """XLA_FLAGS for a child process with `n` simulated CPU devices."""
    return f"{TEST_XLA_FLAGS} --xla_force_host_platform_device_count={n}"


def env(**extra) -> dict[str, str]:
    """This process's environment for a CPU child that imports the checkout, one device, no debug switches, with
    `extra` set."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", XLA_FLAGS=TEST_XLA_FLAGS)
    out.pop("JAXLM_DEBUG", None)
    return {**out, **extra}


def needs(extra: str):
    """The `extra` mark: the test is skipped, naming the extra's install command, unless the pyproject extra is
    installed (tests/conftest.py); `python -m pytest -m extra` selects every such test."""
    import pytest

    return pytest.mark.extra(extra)


def missing_extra(extra: str) -> str | None:
    """Why a test marked `extra(extra)` cannot run here (the extra's install command), or None."""
    import importlib.util

    from jaxlm.core import extras, platform

    if extra == "gpu-compile":
        from jaxlm.predict.target import EXTRA

        return None if platform.cuda_plugin_installed() else f"needs XLA's GPU compiler: {EXTRA}"
    module = next(m for m, e in extras.known().items() if e == extra)  # its first module: torch, matplotlib, xprof
    return None if importlib.util.find_spec(module) else extras.missing_message(module)


def needs_compiler(test):
    """For a test that compiles for a GPU target: skipped without XLA's GPU compiler, slow, and in one xdist
    group per module (its module-scoped compiled programs are built once; the modules spread over the workers)."""
    import pytest

    group = pytest.mark.xdist_group("gpu_compile-" + test.__module__.rsplit(".", 1)[-1])
    return needs("gpu-compile")(pytest.mark.slow(group(test)))


def tiny_overrides(data_dir, out_dir, **extra) -> list[str]:
    base = {
        "model.vocab_size": 257, "model.context_length": 32, "model.d_model": 32, "model.num_layers": 2,
        "model.num_heads": 2, "model.d_ff": 64,
        "data.dir": f'"{data_dir}"', "data.source": "[]", "data.tokenizer": '"bytes"', "data.batch_size": 8,
        "optim.lr": 3e-3, "optim.min_lr": 3e-4, "optim.warmup_steps": 5, "optim.cosine_steps": 40,
        "train.steps": 20, "train.out_dir": f'"{out_dir}"', "train.eval_every": 10, "data.eval_tokens": 512,
        "log.every": 1, "log.sample_tokens": 0, "log.progress": "false",  # a test that reads the sample asks for it
        "checkpoint.every": 10,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def make_corpus(data_dir: Path) -> Path:
    """Tokenise ~60 kB of Python's docs with the byte tokenizer into data_dir (train/val/meta)."""
    import pydoc_data.topics

    from jaxlm.core.config import DataConfig
    from jaxlm.data.prepare import ensure_prepared

    text = "\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))[:60000]
    data_dir.mkdir(parents=True, exist_ok=True)
    src = data_dir / "corpus.txt"
    src.write_text(text)
    return ensure_prepared(DataConfig(dir=str(data_dir), source=[str(src)], tokenizer="bytes"), progress=False)


def losses(run_dir) -> dict[int, float]:
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "train":
            out[r["step"]] = r["train/loss"]
    return out


def run_steps(cfg, mesh, n: int, seed_data: int = 0):
    """n train steps of `cfg` on `mesh` with fixed random batches; returns (losses, final params as numpy)."""
    import jax

    from jaxlm.core import sharding
    from jaxlm.training.loop import build

    b = build(cfg, mesh)
    state = jax.jit(b.make_state, out_shardings=b.shardings)()
    rng = np.random.default_rng(seed_data)
    out = []
    for _ in range(n):
        tok = rng.integers(0, cfg.model.vocab_size, (cfg.data.batch_size, cfg.model.context_length + 1))
        tok = tok.astype(np.int32)
        x, y = sharding.global_batch(tok[:, :-1], mesh), sharding.global_batch(tok[:, 1:], mesh)
        state, m = b.step_fn(state, x, y)
        out.append(float(m["loss"]))
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    return np.array(out), params


def max_param_diff(a, b) -> float:
    import jax

    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def loss_and_grads(cfg, mesh, seed_data: int = 0):
    """The loss and parameter gradients of `cfg`'s initial model on one fixed random batch, on `mesh`."""
    import jax
    from flax import nnx

    from jaxlm.core import sharding
    from jaxlm.nn.loss import lm_loss
    from jaxlm.training.loop import build

    b = build(cfg, mesh)
    state = jax.jit(b.make_state, out_shardings=b.shardings)()
    shape = (cfg.data.batch_size, cfg.model.context_length + 1)
    tok = np.random.default_rng(seed_data).integers(0, cfg.model.vocab_size, shape)
    x, y = (sharding.global_batch(t.astype(np.int32), mesh) for t in (tok[:, :-1], tok[:, 1:]))

    def loss(params, x, y):
        return lm_loss(nnx.merge(b.graphdef, params, state.non_trainable), x, y)

    bsh = sharding.batch_sharding(mesh)
    fn = sharding.on_mesh(jax.jit(jax.value_and_grad(loss), in_shardings=(b.shardings.params, bsh, bsh)), mesh)
    value, grads = fn(state.params, x, y)
    return float(value), jax.tree.map(np.asarray, jax.device_get(grads))


def max_rel_diff(a, b) -> float:
    """max over leaves of max|a - b| / max|b|."""
    import jax

    return max(float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# name -> parallel.* (and compute.*) overrides, each run on 8 simulated devices against one device
LAYOUTS = {
    "dp": {"parallel.data": 8},
    "fsdp": {"parallel.data": 1, "parallel.fsdp": 8},
    "fsdp_dp": {"parallel.data": 2, "parallel.fsdp": 4},
    "tp": {"parallel.data": 1, "parallel.tensor": 8, "model.num_heads": 8},
    "tp_dp": {"parallel.data": 2, "parallel.tensor": 4},
    "tp_fsdp": {"parallel.data": 1, "parallel.fsdp": 2, "parallel.tensor": 4},
    # grouped-query attention: 8 query heads, 4 key/value heads of width 6 (not 32 / 8), 2 and 1 per tensor shard
    "tp_gqa": {"parallel.data": 2, "parallel.tensor": 4, "model.num_heads": 8, "model.num_kv_heads": 4,
               "model.head_size": 6},
    "scan_fsdp_tp": {"parallel.data": 1, "parallel.fsdp": 2, "parallel.tensor": 4, "compute.scan_layers": "true"},
    "accum_dp": {"parallel.data": 8, "train.grad_accum": 2},
    "pp": {"parallel.data": 1, "parallel.pipeline": 8, "parallel.microbatches": 4, "model.num_layers": 8,
           "compute.scan_layers": "true"},
    "pp_dp": {"parallel.data": 4, "parallel.pipeline": 2, "parallel.microbatches": 2, "compute.scan_layers": "true"},
    "pp_lora": {"parallel.data": 4, "parallel.pipeline": 2, "parallel.microbatches": 2, "compute.scan_layers": "true",
                "lora.rank": 4, "lora.base": '"nf4"', "lora.block_size": 16},
    "pp_qat": {"parallel.data": 4, "parallel.pipeline": 2, "parallel.microbatches": 2, "compute.scan_layers": "true",
               "qat.weight_bits": 8},
    # the chunked loss with the vocabulary split over tensor (264 divides by 8): blocks of 6 and 3 positions, padded
    "tp2_chunk": {"parallel.data": 4, "parallel.tensor": 2, "model.vocab_size": 264, "compute.loss_chunk": 100},
    "tp4_chunk": {"parallel.data": 2, "parallel.tensor": 4, "model.vocab_size": 264, "compute.loss_chunk": 48},
}


def _devices_main():
    """8 simulated devices: each layout gives one device's loss and gradients, and its 20-step losses."""
    import jax

    from jaxlm.core import sharding
    from jaxlm.core.config import load_config
    from jaxlm.training.loop import build

    assert jax.device_count() == 8, jax.devices()
    names = sys.argv[2:] or list(LAYOUTS)
    base = {"data.batch_size": 16, "model.num_heads": 4, "model.d_ff": 64}
    out, one_device = {}, {}  # layouts with the same single-device config share its reference
    for name in names:
        extra = {**base, **LAYOUTS[name]}
        single = {k: v for k, v in extra.items() if not k.startswith("parallel.")}
        cfg1 = load_config(None, tiny_overrides("/unused", "/unused", **single))
        cfg8 = load_config(None, tiny_overrides("/unused", "/unused", **extra))
        mesh1, mesh8 = sharding.make_mesh(jax.devices()[:1]), sharding.make_mesh(cfg=cfg8.parallel)
        key = json.dumps(single, sort_keys=True)
        if key not in one_device:
            one_device[key] = (*loss_and_grads(cfg1, mesh1), run_steps(cfg1, mesh1, 20)[0])
        l1, g1, t1 = one_device[key]
        l8, g8 = loss_and_grads(cfg8, mesh8)
        t8, _ = run_steps(cfg8, mesh8, 20)
        shardings = build(cfg8, mesh8).shardings  # trainable and frozen (a LoRA base) parameters
        specs = {str(s.spec) for s in jax.tree.leaves((shardings.params, shardings.non_trainable))}
        out[name] = {"loss_rel": abs(l8 - l1) / abs(l1), "grad_rel": max_rel_diff(g8, g1),
                     "traj_rel": float(np.max(np.abs(t8 - t1) / np.abs(t1))), "specs": sorted(specs)}
        print(name, out[name], file=sys.stderr, flush=True)
    print(json.dumps(out))


def _slow_train_main():
    import time

    from jaxlm import cli
    from jaxlm.cli import train as command
    from jaxlm.training import loop

    delay, run_call = float(sys.argv[2]), loop.run_call

    def slow(state):
        time.sleep(delay)
        run_call(state)

    loop.run_call = slow
    sys.exit(cli.run(command.main, sys.argv[3:]))


def _hold_locks_main():
    import time

    from jaxlm.core.lock import DirLock

    for d in sys.argv[2:]:
        DirLock(d, d).acquire()
    print("held", flush=True)
    time.sleep(3600)


def _file_size_limit_main():
    import resource
    import runpy

    limit, module = int(sys.argv[2]), sys.argv[3]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _signal_at_main():
    import importlib
    import runpy
    import signal

    signame, point, module, args = *sys.argv[2:5], sys.argv[5:]
    sys.orig_argv = [sys.executable, "-m", module, *args]  # before jaxlm is imported: it is `python -m MODULE`
    from jaxlm.core import platform

    platform.prepare()  # as jaxlm.cli does, before the point's module imports JAX
    where, _, name = point.partition(":")
    owner = importlib.import_module(where)
    *path, attr = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    real, sent = getattr(owner, attr), []

    def signalled(*a, **kw):
        if not sent:
            sent.append(True)
            signal.raise_signal(signal.Signals[signame])  # its handler runs before the next line
        return real(*a, **kw)

    setattr(owner, attr, signalled)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def hold_locks(*dirs):
    """A process holding the locks of `dirs` (it has them when this returns); kill it to leave them stale."""
    import subprocess

    proc = subprocess.Popen([sys.executable, __file__, "hold-locks", *map(str, dirs)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    {"devices": _devices_main, "slow-train": _slow_train_main, "hold-locks": _hold_locks_main,
     "file-size-limit": _file_size_limit_main, "signal-at": _signal_at_main}[sys.argv[1]]()
