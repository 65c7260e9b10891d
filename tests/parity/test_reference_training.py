"""torchref's loss, optimizer, schedule, clipping, batching and checkpoints through the adapters."""

import io
import math
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchref
from tests import adapters
from torchref import ModelConfig


def test_cross_entropy_matches_torch_and_is_stable():
    logits, targets = torch.randn(8, 50), torch.randint(0, 50, (8,))
    torch.testing.assert_close(adapters.run_cross_entropy(logits, targets), F.cross_entropy(logits, targets))
    huge = logits * 1e4
    got = adapters.run_cross_entropy(huge, targets)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, F.cross_entropy(huge, targets))
    seq = torch.randn(2, 5, 50)  # leading (batch, seq) axes also work
    tgt = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(adapters.run_cross_entropy(seq, tgt), F.cross_entropy(seq.flatten(0, 1), tgt.flatten()))


def test_gradient_clipping_matches_torch_and_skips_frozen():
    torch.manual_seed(0)
    for max_norm in (1e-2, 1.0, 1e4):
        a = [torch.nn.Parameter(torch.randn(5, 6)) for _ in range(3)]
        b = [torch.nn.Parameter(p.detach().clone()) for p in a]
        frozen = torch.nn.Parameter(torch.randn(4), requires_grad=False)
        for p, q in zip(a, b):
            g = torch.randn_like(p) * 3
            p.grad, q.grad = g.clone(), g.clone()
        adapters.run_gradient_clipping(a + [frozen], max_norm)
        torch.nn.utils.clip_grad_norm_(b, max_norm)
        for p, q in zip(a, b):
            torch.testing.assert_close(p.grad, q.grad)
        assert frozen.grad is None


def _problem(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    x, y = torch.randn(64, 6), torch.randn(64, 3)
    return model, x, y


@pytest.mark.parametrize("wd", [0.0, 0.01, 0.1])
def test_adamw_follows_torch_for_1000_steps(wd):
    ours, x, y = _problem()
    ref, _, _ = _problem()
    opt = adapters.get_adamw_cls()(ours.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    for _ in range(1000):
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            F.mse_loss(m(x), y).backward()
            o.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, atol=1e-4, rtol=0)
    assert F.mse_loss(ours(x), y) < 0.5 * F.mse_loss(_problem()[0](x), y)  # it actually optimised


def test_adamw_single_step_by_hand():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = adapters.get_adamw_cls()([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.5)
    p.grad = torch.tensor([0.5, 0.25])
    opt.step()
    # m = 0.1 g, v = 0.001 g^2, alpha = 0.1 sqrt(0.001)/0.1: the step is lr * sign(g) (up to eps).
    decayed = torch.tensor([1.0, -2.0]) * (1 - 0.1 * 0.5)
    torch.testing.assert_close(p.detach(), decayed - 0.1 * torch.tensor([1.0, 1.0]), atol=1e-6, rtol=0)


def test_cosine_schedule_spec_example():
    lr = lambda t: adapters.run_get_lr_cosine_schedule(t, 1.0, 0.1, 7, 21)  # noqa: E731
    assert lr(0) == 0.0
    assert lr(3) == pytest.approx(3 / 7)
    assert lr(7) == pytest.approx(1.0)
    assert lr(14) == pytest.approx(0.55)
    assert lr(21) == pytest.approx(0.1)
    assert lr(100) == pytest.approx(0.1)
    values = [lr(t) for t in range(7, 22)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay


def test_get_batch_ranges_shift_and_device():
    data = np.arange(100, dtype=np.uint16)
    starts = set()
    for _ in range(300):
        x, y = adapters.run_get_batch(data, 8, 7, "cpu")
        assert x.shape == y.shape == (8, 7) and x.dtype == y.dtype == torch.int64
        assert torch.equal(y, x + 1)  # targets are inputs shifted by one
        assert torch.equal(x - x[:, :1], torch.arange(7).expand(8, 7))  # contiguous windows
        starts.update(x[:, 0].tolist())
    assert starts == set(range(0, 100 - 7))  # every legal start 0..len-m-1 drawn, none beyond
    with pytest.raises((RuntimeError, AssertionError)):
        adapters.run_get_batch(data, 2, 7, "cuda:99")
    with pytest.raises(RuntimeError):
        adapters.run_get_batch(data, 2, 7, "not-a-device")


def test_get_batch_reads_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    x, y = adapters.run_get_batch(np.memmap(path, dtype=np.uint16, mode="r"), 4, 16, "cpu")
    assert torch.equal(y, x + 1)


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, model.cfg.vocab_size, (4, 9), generator=g)
        loss = torchref.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("as_file", [False, True])
def test_checkpoint_round_trip_continues_identically(tmp_path, as_file):
    cfg = ModelConfig(vocab_size=31, context_length=8, d_model=16, num_layers=2, num_heads=2, d_ff=32)
    torch.manual_seed(0)
    model = torchref.TransformerLM(cfg)
    opt = adapters.get_adamw_cls()(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, 5, seed=1)
    target = io.BytesIO() if as_file else tmp_path / "ckpt.pt"
    adapters.run_save_checkpoint(model, opt, 5, target)
    if as_file:
        target.seek(0)

    torch.manual_seed(123)  # a differently initialised model and a fresh optimizer
    restored = torchref.TransformerLM(cfg)
    restored_opt = adapters.get_adamw_cls()(restored.parameters(), lr=1e-2, weight_decay=0.1)
    assert adapters.run_load_checkpoint(target, restored, restored_opt) == 5
    for (n, p), q in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(p, q), n
    for p, q in zip(model.parameters(), restored.parameters()):
        s, r = opt.state[p], restored_opt.state[q]
        assert (
            s["step"] == r["step"]
            and torch.equal(s["exp_avg"], r["exp_avg"])
            and torch.equal(s["exp_avg_sq"], r["exp_avg_sq"])
        )
    assert _train(model, opt, 4, seed=2) == _train(restored, restored_opt, 4, seed=2)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_checkpoint_loading_refuses_arbitrary_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "optimizer": {}, "iteration": 0, "x": _Payload()}, path)
    cfg = ModelConfig(vocab_size=11, context_length=4, d_model=8, num_layers=1, num_heads=2, d_ff=16)
    model = torchref.TransformerLM(cfg)
    with pytest.raises(pickle.UnpicklingError):
        adapters.run_load_checkpoint(path, model, torchref.AdamW(model.parameters()))


def test_training_reduces_loss():
    cfg = ModelConfig(vocab_size=16, context_length=8, d_model=32, num_layers=2, num_heads=4, d_ff=64)
    torch.manual_seed(0)
    model = torchref.TransformerLM(cfg)
    opt = torchref.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    ids = torch.arange(9).repeat(4, 1) % 16  # a deterministic, learnable sequence
    first = None
    for _ in range(60):
        loss = torchref.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first and first == pytest.approx(math.log(16), rel=0.6)
