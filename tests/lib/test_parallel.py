"""The mesh sizes, the logical-axis rules and the HLO collective count (one device; the 8-device
equivalence runs in tests/lib/test_train.py)."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import PartitionSpec as P

from jaxlm.bench.layouts import parse_layout
from jaxlm.core import sharding
from jaxlm.core.config import ModelConfig, ParallelConfig, load_config
from jaxlm.core.errors import ConfigError, UsageError
from jaxlm.predict.program import collectives


@pytest.mark.parametrize("kw, n, expected", [
    ({}, 8, dict(data=8, fsdp=1, tensor=1, pipeline=1)),
    (dict(tensor=4), 8, dict(data=2, fsdp=1, tensor=4, pipeline=1)),
    (dict(data=1, fsdp=-1), 8, dict(data=1, fsdp=8, tensor=1, pipeline=1)),
    (dict(data=2, fsdp=2, tensor=2), 8, dict(data=2, fsdp=2, tensor=2, pipeline=1)),
])
def test_mesh_shape_resolves_the_free_axis(kw, n, expected):
    assert sharding.mesh_shape(ParallelConfig(**kw), n) == expected


@pytest.mark.parametrize("kw, n, match", [
    (dict(data=2, tensor=2), 8,
     r"parallel.data = 2, parallel.fsdp = 1, parallel.tensor = 2.*4 devices but there are 8"),
    (dict(tensor=3), 8, r"parallel.tensor = 3.*do not divide the 8 devices"),
])
def test_mesh_shape_errors_name_the_keys(kw, n, match):
    with pytest.raises(ConfigError, match=match):
        sharding.mesh_shape(ParallelConfig(**kw), n)


def test_config_checks():
    with pytest.raises(ConfigError, match=r"--set parallel.fsdp=true"):
        load_config(None, ["parallel.fsdp=true"])  # a size, not a switch
    with pytest.raises(ConfigError, match="at most one mesh axis may be -1"):
        load_config(None, ["parallel.fsdp=-1"])  # data is -1 by default
    with pytest.raises(ConfigError, match=r"parallel.tensor = 0: must be >= 1"):
        load_config(None, ["parallel.tensor=0"])
    with pytest.raises(ConfigError, match=r"lora.dropout = 0.1: the pipeline"):
        load_config(None, ["parallel.pipeline=2", "lora.rank=4", "lora.dropout=0.1"])


def test_tensor_parallel_divisibility_is_checked():
    mesh = sharding.make_mesh(jax.devices()[:1])
    sharding.check_model(ModelConfig(num_heads=4, d_model=64, d_ff=96), mesh)

    class FakeMesh:
        shape = {"tensor": 8, "pipeline": 1}

    with pytest.raises(ConfigError, match=r"model.num_heads = 4: does not divide over parallel.tensor = 8"):
        sharding.check_model(ModelConfig(num_heads=4, d_model=64, d_ff=96), FakeMesh())
    with pytest.raises(ConfigError, match=r"model.d_ff = 100: does not divide over parallel.tensor = 8"):
        sharding.check_model(ModelConfig(num_heads=8, d_model=64, d_ff=100), FakeMesh())


def test_rules_table_maps_logical_axes():
    sizes = dict(data=2, fsdp=2, tensor=2, pipeline=1)
    assert sharding.logical_spec(("heads", "embed"), (64, 32), sizes) == P("tensor", "fsdp")
    assert sharding.logical_spec(("layers", "embed", "mlp"), (3, 32, 64), sizes) == P(None, "fsdp", "tensor")
    assert sharding.logical_spec(("vocab", "embed"), (257, 32), sizes) == P(None, "fsdp")  # 257 does not divide
    assert sharding.logical_spec(("norm",), (32,), sizes) == P(None)
    act = sharding.logical_spec(("batch", "seq", "embed"), (8, 16, 32), sizes, activation=True)
    assert act == P(("data", "fsdp"), None, None)  # activations keep embed whole; the batch splits over both


def test_collectives_read_from_hlo():
    hlo = """HloModule m

ENTRY %main () -> f32[3] {
  %all-reduce.1 = f32[128,256]{1,0} all-reduce(f32[128,256]{1,0} %x), replica_groups={{0,1}}
  %ag = (bf16[4,8]{1,0}, f32[2]{0}) all-gather-start(bf16[2,8]{1,0} %y, f32[1]{0} %z), dimensions={0}
  %cp = s32[10]{0} collective-permute(s32[10]{0} %w), source_target_pairs={{0,1}}
  ROOT %add = f32[3]{0} add(f32[3]{0} %a, f32[3]{0} %b)
}
"""
    c = collectives(hlo)
    assert c["all-reduce"] == {"count": 1, "bytes": 128 * 256 * 4}
    assert c["all-gather"] == {"count": 1, "bytes": 4 * 8 * 2 + 2 * 4}
    assert c["collective-permute"] == {"count": 1, "bytes": 40}
    assert c["reduce-scatter"]["count"] == 0


def test_parse_layout():
    assert parse_layout("tensor=4,data=2") == dict(data=2, fsdp=1, tensor=4, pipeline=1)
    with pytest.raises(UsageError, match="--layout 'model=2'"):
        parse_layout("model=2")


def test_resume_keeps_the_layer_layout(tmp_path):
    """A checkpoint restores in the layout it was saved in: changing compute.scan_layers on resume is refused."""
    from jaxlm.core.errors import CheckpointError
    from jaxlm.training.preflight import check_compatible, run_identity

    saved, now = load_config(None, []), load_config(None, ["compute.scan_layers=true"])
    with pytest.raises(CheckpointError, match=r"compute.scan_layers: checkpoint false, config true"):
        check_compatible(run_identity(saved), now, tmp_path, "checkpoint")


def test_start_up_makes_the_mesh_and_checks_its_layout_once(tmp_path, monkeypatch):
    """The start-up in one pass (`preflight.launch`): one mesh, its layout checked once (sharding.check_layout);
    the loop builds its steps on that mesh."""
    from collections import Counter

    from jaxlm.core.stop import StopFlag
    from jaxlm.training import loop
    from tests.train_helpers import make_corpus, tiny_overrides

    names = ("make_mesh", "check_model", "check_pipeline", "check_batch")
    calls = Counter()
    for name in names:
        real = getattr(sharding, name)
        monkeypatch.setattr(sharding, name, lambda *a, _f=real, **k: (calls.update([_f.__name__]), _f(*a, **k))[1])
    cfg = load_config(None, tiny_overrides(make_corpus(tmp_path / "data"), tmp_path / "run", **{"train.steps": 2}))
    with StopFlag() as stop:
        loop.start(cfg, stop).close()
    assert calls == dict.fromkeys(names, 1)


def test_bench_parallel_measures_the_pipeline_bubble(tmp_path):
    """One row per micro-batch count: the analytic bubble (P-1)/(M+P-1) and the measured one against the
    same 4 devices without a pipeline (timed once, shared by the rows)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    tiny = ["model.vocab_size=64", "model.d_model=32", "model.d_ff=64", "model.num_layers=2", "model.num_heads=2",
            "compute.scan_layers=true"]
    cmd = [sys.executable, "-m", "jaxlm.bench", "parallel", "--devices", "4", "--batch", "8", "--context", "16",
           "--steps", "1", "--layout", "pipeline=2,data=2", "--microbatches", "1", "4", "--json", str(out)]
    r = subprocess.run(cmd + sum((["--set", o] for o in tiny), []), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["microbatches"], x["bubble"]) for x in rows] == [(1, 0.5), (4, 0.2)]
    assert {x["reference_layout"] for x in rows} == {"data=4"} and len({x["reference_step_ms"] for x in rows}) == 1
    for x in rows:
        assert x["bubble_measured"] == pytest.approx(1 - x["reference_step_ms"] / x["step_ms"])
        assert x["collectives"]["collective-permute"]["count"] >= 1
