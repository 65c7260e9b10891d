"""Shared pieces of the training tests: a tiny config, a tiny token corpus, step runners.

Also runnable as a script for subprocess tests: `python tests/train_helpers.py devices`
(several simulated devices), `python tests/train_helpers.py slow-train DELAY ARGS...`
(`python -m jaxlm.train ARGS...` with each jitted call delayed, so a test can kill it mid-run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def tiny_overrides(data_dir, out_dir, **extra) -> list[str]:
    base = {
        "model.vocab_size": 257, "model.context_length": 32, "model.d_model": 32, "model.num_layers": 2,
        "model.num_heads": 2, "model.d_ff": 64,
        "data.dir": f'"{data_dir}"', "data.source": "[]", "data.tokenizer": '"bytes"', "data.batch_size": 8,
        "optim.lr": 3e-3, "optim.min_lr": 3e-4, "optim.warmup_steps": 5, "optim.cosine_steps": 40,
        "train.steps": 20, "train.out_dir": f'"{out_dir}"', "train.eval_every": 10, "train.eval_batches": 2,
        "log.every": 1, "log.sample_tokens": 8, "log.progress": "false",
        "checkpoint.every": 10,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def make_corpus(data_dir: Path) -> Path:
    """Tokenise ~60 kB of Python's docs with the byte tokenizer into data_dir (train/val/meta)."""
    import pydoc_data.topics

    from jaxlm.config import DataConfig
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

    from jaxlm import parallel
    from jaxlm.train import build

    b = build(cfg, mesh)
    state = jax.jit(b.make_state, out_shardings=b.shardings)()
    rng = np.random.default_rng(seed_data)
    out = []
    for _ in range(n):
        tok = rng.integers(0, cfg.model.vocab_size, (cfg.data.batch_size, cfg.model.context_length + 1)).astype(np.int32)
        x, y = parallel.global_batch(tok[:, :-1], mesh), parallel.global_batch(tok[:, 1:], mesh)
        state, m = b.step_fn(state, x, y)
        out.append(float(m["loss"]))
    params = jax.tree.map(np.asarray, jax.device_get(state.params))
    return np.array(out), params


def max_param_diff(a, b) -> float:
    import jax

    return max(float(np.max(np.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _devices_main():
    """8 simulated devices: data parallel and FSDP equal one device on the same global batch."""
    import jax

    from jaxlm import parallel
    from jaxlm.config import load_config

    assert jax.device_count() == 8, jax.devices()
    cfg = load_config(None, tiny_overrides("/unused", "/unused", **{"data.batch_size": 16}))
    one, p1 = run_steps(cfg, parallel.make_mesh(jax.devices()[:1]), 4)
    dp, p8 = run_steps(cfg, parallel.make_mesh(), 4)
    fcfg = load_config(None, tiny_overrides("/unused", "/unused", **{"data.batch_size": 16, "parallel.fsdp": "true"}))
    fs, pf = run_steps(fcfg, parallel.make_mesh(), 4)
    acc_cfg = load_config(None, tiny_overrides("/unused", "/unused", **{"data.batch_size": 16, "train.grad_accum": 2}))
    acc, pa = run_steps(acc_cfg, parallel.make_mesh(), 4)
    # FSDP really shards: some parameter is split over the 8 devices.
    from jaxlm.train import build

    shard_specs = {str(s.spec) for s in jax.tree.leaves(build(fcfg, parallel.make_mesh()).shardings.params)}
    print(json.dumps({
        "one": one.tolist(), "dp": dp.tolist(), "fsdp": fs.tolist(), "accum": acc.tolist(),
        "dp_param_diff": max_param_diff(p1, p8), "fsdp_param_diff": max_param_diff(p1, pf),
        "accum_param_diff": max_param_diff(p1, pa), "fsdp_specs": sorted(shard_specs),
    }))


def _slow_train_main():
    import time

    from jaxlm import cli, train

    delay, run_call = float(sys.argv[2]), train.run_call

    def slow(loop):
        time.sleep(delay)
        run_call(loop)

    train.run_call = slow
    sys.exit(cli.run(train.main, sys.argv[3:]))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    {"devices": _devices_main, "slow-train": _slow_train_main}[sys.argv[1]]()
