"""Fine-tuning on a mesh (train.init_from places the weights with the state's shardings) and pipeline dropout
(each micro-batch draws its own masks)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.system.fault_helpers import PY
from tests.train_helpers import ROOT, env, xla_devices

# --------------------------------------------------------------------------- fine-tuning on a mesh, pipeline dropout

MESH_INIT_FROM = """
import json, sys, jax, numpy as np
from flax import nnx
from jaxlm.core.config import load_config
from jaxlm.core.stop import StopFlag
from jaxlm.nn import scan
from jaxlm.training.checkpoint import restore_for_inference
from jaxlm.training.loop import start
from tests.train_helpers import tiny_overrides
assert jax.device_count() == 4
base, corpus, out, layouts = *sys.argv[1:4], json.loads(sys.argv[4])
for i, layout in enumerate(layouts):
    cfg = load_config(None, tiny_overrides(corpus, f"{out}{i}", **{"train.init_from": repr(base)}) + layout)
    with StopFlag() as stop:
        loop = start(cfg, stop)
        model = restore_for_inference(base)[0]
        if cfg.compute.scan_layers:
            model.layers = scan.stack(list(model.layers))
        want, got = nnx.state(model, nnx.Param), loop.state.params
        g, w = jax.tree.leaves(got), jax.tree.leaves(want)
        assert len(g) == len(w) and all(np.array_equal(a, b) for a, b in zip(g, w)), layout
        assert {len(a.sharding.device_set) for a in jax.tree.leaves(got)} == {4}, layout
        loop.close()
print("ok")
"""


# data x fsdp, data x tensor, data x pipeline (the layers restacked)
LAYOUTS = {"fsdp": ["parallel.fsdp=2"], "tensor": ["parallel.tensor=2"],
           "pipeline": ["parallel.pipeline=2", "compute.scan_layers=true"]}


@pytest.mark.slow
@pytest.mark.xdist_group("faults-files")  # the trained run of `files`, built once (test_bad_invocations.py)
@pytest.mark.parametrize("names", [pytest.param(["pipeline"], id="pipeline"),
                                   pytest.param(["fsdp", "tensor"], id="fsdp-tensor", marks=pytest.mark.extended)])
def test_init_from_on_every_mesh_layout(names, files, tmp_path):
    """The weights are placed with the state's shardings on 4 devices, equal to the run's. The default case is
    the pipeline layout (the weights restacked, then placed); fsdp and tensor placements are extended, their
    shardings covered by tests/lib/test_train.py's layout tests and init_from by tests/lib/test_peft.py."""
    layouts = json.dumps([LAYOUTS[n] for n in names])
    r = subprocess.run([PY, "-c", MESH_INIT_FROM, files["run"], files["corpus"], str(tmp_path / "out"), layouts],
                       env=env(XLA_FLAGS=xla_devices(4)), capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


PIPELINE_DROPOUT = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxlm.core import sharding
from jaxlm.core.config import ComputeConfig, ModelConfig, ParallelConfig
from jaxlm.nn import pipeline, scan
from jaxlm.nn.model import TransformerLM, _block_forward
cfg = ModelConfig(vocab_size=64, context_length=8, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.5)
model = TransformerLM(cfg, ComputeConfig(scan_layers=True), rngs=nnx.Rngs(0), microbatches=2)
B, T, D, M = 4, 8, 16, 2
x = jnp.tile(jax.random.normal(jax.random.key(1), (1, T, D)), (B, 1, 1))  # every row the same tokens
keys = jax.random.split(jax.random.key(2), cfg.num_layers)  # (L,) dropout keys
rope = model.rope(jnp.arange(T))
fn = lambda b, h, k: (_block_forward(b, h, rope, k), None)
with jax.set_mesh(sharding.make_mesh(cfg=ParallelConfig(data=1, pipeline=2, microbatches=M))):
    got = np.asarray(jax.jit(lambda x, k: pipeline.pipeline(model.layers, fn, x, k, microbatches=M))(x, keys))
assert np.abs(got[0] - got[1]).max() > 0.1, "rows 0 and 1 (micro-batches 0 and 1) got the same dropout masks"
want = np.zeros_like(got)  # one device: micro-batch m (rows m, m + M, ...) with the keys folded with m
fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
for m in range(M):
    want[m::M] = np.asarray(scan.scan(model.layers, fn, x[m::M], fold(keys, m))[0])
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.slow
def test_pipeline_micro_batches_draw_their_own_dropout_masks():
    r = subprocess.run([PY, "-c", PIPELINE_DROPOUT], env=env(XLA_FLAGS=xla_devices(2)),
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
