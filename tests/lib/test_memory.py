"""jaxlm.memory: the estimator by hand and the CLI (against the compilers' plans:
tests/lab/test_memory_validation.py)."""

import json

import pytest

from jaxlm import cli
from jaxlm.analysis import memory
from jaxlm.analysis.devices import DEVICES
from jaxlm.analysis.flops import param_counts
from jaxlm.cli import memory as memory_cli
from jaxlm.core.config import ComputeConfig, ModelConfig


def test_state_by_hand_and_linear_in_batch():
    cfg = ModelConfig(d_model=64, num_layers=2, num_heads=4, vocab_size=100, context_length=32)
    p = param_counts(cfg)["total"]
    est = memory.estimate(cfg, 3, 32, backend="cpu")
    assert est.state == {"parameters (float32)": 4 * p, "gradients (float32)": 4 * p,
                         "AdamW moments m, v (float32)": 8 * p}
    assert est.activation_total == pytest.approx(3 * memory.estimate(cfg, 1, 32, backend="cpu").activation_total)
    # Per token: embedding D, per layer 6 D + 4 F + 4 N T float32 + the N T byte mask, then 2 V for the loss.
    per_token = 4 * (64 + 2 * (6 * 64 + 4 * cfg.d_ff + 4 * 4 * 32) + 2 * 100) + 2 * 4 * 32
    assert est.activation_total == 3 * 32 * per_token
    bf16 = memory.estimate(cfg, 3, 32, ComputeConfig(dtype="bfloat16"), backend="cpu")
    assert bf16.state["bfloat16 weight copies"] == 2 * p


def test_techniques_order_and_fsdp_shards_the_state():
    cfg = ModelConfig.from_name("small")
    act = lambda **kw: memory.estimate(cfg, 8, 1024, ComputeConfig(**kw)).activation_total
    base = act()
    assert act(remat="full") < act(remat="dots_saveable") < base
    # scanned layers run "none" as dots_saveable (ComputeConfig.remat_policy): the estimate prices that
    assert act(scan_layers=True) == act(remat="dots_saveable")
    assert act(scan_layers=True, remat="full") == act(remat="full")
    assert act(dtype="bfloat16", attention="cudnn") < act(dtype="bfloat16") < base
    one = memory.estimate(cfg, 8, 1024)
    four = memory.estimate(cfg, 8, 1024, mesh=memory.Mesh(4, fsdp=True))
    assert four.state["AdamW moments m, v (float32)"] == one.state["AdamW moments m, v (float32)"] / 4
    assert four.activation_total == pytest.approx(one.activation_total / 4)


def test_largest_batch_is_the_last_that_fits():
    cfg, cap = ModelConfig.from_name("small"), 24 * 2**30
    b = memory.largest_batch(cfg, 1024, cap)
    assert b > 0
    assert memory.estimate(cfg, b, 1024).total <= cap < memory.estimate(cfg, b + 1, 1024).total


def test_cli_prints_the_breakdown_and_largest_batch(capsys):
    argv = ["--preset", "large", "--context", "1024", "--batch", "4", "--dtype", "bfloat16", "--device", "h100-80gb"]
    assert cli.run(memory_cli.main, argv) == 0
    out = capsys.readouterr().out
    for text in ("AdamW moments", "layers: attention scores", "layers: feed-forward hidden", "predicted peak",
                 "largest batch that fits"):
        assert text in out
    assert cli.run(memory_cli.main, [*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["largest_batch"] == memory.largest_batch(ModelConfig.from_name("large"), 1024,
                                                      DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE,
                                                      ComputeConfig(dtype="bfloat16"))


@pytest.mark.parametrize("argv", [["--memory", "lots"], ["--attention", "cudnn", "--dtype", "float32"],
                                  ["--device", "h100-80gb", "--memory", "1GB"], ["--batch", "0"]])
def test_cli_bad_input_is_one_line_exit_2(argv, capsys):
    assert cli.run(memory_cli.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_parse_size():
    assert memory_cli.parse_size("24GiB") == 24 * 2**30
    assert memory_cli.parse_size("80GB") == 80e9
    assert memory_cli.parse_size("512 MiB") == 512 * 2**20


def test_the_gpu_model_by_hand():
    """GPU calibration: the larger of the step's two moments. The backward's: each kind of tensor's element count
    times its fitted bytes (GPU_BYTES), under offload plus every layer's offloaded matmul outputs and attention
    probabilities back on the device; the logits': what the blocks keep and the logits with their float32
    gradient (the compute-dtype logits and a float32 gradient per element; a chunked loss's block 8 bytes)."""
    cfg = ModelConfig(d_model=64, num_layers=3, num_heads=4, d_ff=96, vocab_size=100, context_length=32)
    c = memory.GPU_BYTES[("bfloat16", "none", False)]
    tokens = 5 * 32
    kept = [tokens * 3 * 64 * c[0], tokens * 3 * 96 * c[1], 3 * 5 * 4 * 32 * 32 * c[2], tokens * 64 * c[4]]
    acts = memory.activations(cfg, 5, 32, ComputeConfig(dtype="bfloat16"))
    assert sum(acts.values()) == pytest.approx(sum(kept) + max(tokens * 100 * c[3], (4 + 2) * tokens * 100))
    chunked = memory.activations(cfg, 5, 32, ComputeConfig(dtype="bfloat16", loss_chunk=40))  # 8 positions x 5 rows
    assert chunked["logits / loss"] == 8 * 8 * 5 * 100  # float32 logits and gradient of 8 positions x 5 rows
    cudnn = memory.activations(cfg, 5, 32, ComputeConfig(dtype="bfloat16", attention="cudnn"))
    assert cudnn["layers: attention scores"] == 0.0

    large = ModelConfig(d_model=64, num_layers=3, num_heads=4, d_ff=96, vocab_size=5000, context_length=32)
    full = memory.activations(large, 5, 32, ComputeConfig(dtype="bfloat16", remat="full", loss_chunk=0))
    assert full == {"layers: block inputs (remat)": 2 * tokens * 3 * 64, "logits / loss": 6 * tokens * 5000}
    one = memory.activations(cfg, 5, 32, ComputeConfig(dtype="bfloat16", remat="full"))
    offload = memory.activations(cfg, 5, 32, ComputeConfig(dtype="bfloat16", remat="offload"))
    # per token, in all layers but the one differentiated: q, k, v 3 x 64, the output projection and w2 2 x 64,
    # w1 and w3 2 x 96, the probabilities 4 x 32
    assert offload["back from the host (offload)"] == 2 * tokens * (3 - 1) * (3 * 64 + 2 * 64 + 2 * 96 + 4 * 32)
    assert sum(offload.values()) == pytest.approx(sum(one.values()) + offload["back from the host (offload)"])


def test_the_logits_do_not_depend_on_the_remat_policy():
    """The head is outside every block's remat: remat full at a large vocabulary keeps the whole logits."""
    cfg = ModelConfig(vocab_size=50257, context_length=256, d_model=256, num_layers=4, num_heads=8, d_ff=1024,
                      tie_embeddings=True)
    for remat in ("none", "full", "dots_saveable", "offload"):
        est = memory.estimate(cfg, 32, 256, ComputeConfig(remat=remat, loss_chunk=0))
        assert est.activations["logits / loss"] == 8 * 32 * 256 * 50257  # float32: the logits and their gradient


# Issue 36's settings as compiled for an H100 (docs/results/compiled/h100-80gb.json; nothing compiles here):
# the RTX 5090 study's model (4 layers, d_model 256, 8 heads, d_ff 1024, vocabulary 50,257, tied) under every
# remat policy x whole or chunked logits x precision, the batches 32 and 128 too where the logits dominate, and
# small at context 1024 under offload. The coefficients before the logits' moment was modelled (remat full's
# logits term 0, offload priced as full) were 60-87 % low on the whole-logits rows.
RTX5090 = ["model.num_layers=4", "model.d_model=256", "model.num_heads=8", "model.d_ff=1024",
           "model.vocab_size=50257", "model.tie_embeddings=true"]
ISSUE_ROWS = [
    *((None, d, r, 256, b, c) for r in ("none", "full", "dots_saveable", "offload") for c in (0, 1024)
      for d in ("float32", "bfloat16") for b in ((32, 64, 128) if r in ("full", "offload") else (64,))),
    *(("small", d, "offload", 1024, 8, None) for d in ("float32", "bfloat16")),
]


def _job(preset, dtype, remat, context, batch, chunk) -> dict:
    """The compile store's job of a row (as the memory validation study spells it)."""
    return {"preset": preset, "mode": "train_step",
            "set": [f"model.context_length={context}", f"data.batch_size={batch}", f'compute.dtype="{dtype}"',
                    f'compute.remat="{remat}"', 'compute.attention="xla"', *([] if preset else RTX5090),
                    *([f"compute.loss_chunk={chunk}"] if chunk is not None else [])]}


def test_the_gpu_model_within_fifteen_percent_of_the_compiled_plan_under_every_remat_policy():
    from pathlib import Path

    from jaxlm.predict.store import job_config

    stored = json.loads((Path(__file__).resolve().parents[2] / "docs/results/compiled/h100-80gb.json").read_text())
    totals = {json.dumps(json.loads(k)[0], sort_keys=True): v["total_bytes"] for k, v in stored.items()
              if json.loads(k)[1:3] == ["h100-80gb", 1] and "total_bytes" in v}  # [job, target, GPUs, jax version]
    errors = {}
    for row in ISSUE_ROWS:
        job = _job(*row)
        cfg = job_config(job)
        est = memory.estimate(cfg.model, cfg.data.batch_size, cfg.model.context_length, cfg.compute)
        errors[row] = est.total / totals[json.dumps(job, sort_keys=True)] - 1
    assert len(errors) == 34 and max(map(abs, errors.values())) <= 0.15, errors

