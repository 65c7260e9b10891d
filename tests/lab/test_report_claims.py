"""The facts the written report states: each against a hand-checked figure or an independent route."""

from __future__ import annotations

import math


def test_attention_share_is_the_estimators_attention_scores_entry():
    from deliverables.written.claims import attention_share

    # Hand-checked with jaxlm's own coefficients (issue 40): about 28 % at T = 256 and 60 % at T = 1024.
    assert 25 <= attention_share(256) <= 31 and 57 <= attention_share(1024) <= 63


def test_memory_fits_keep_each_compiler_apart():
    from deliverables.report.bench import fit_memory_batch, fit_memory_context

    def row(t, b, gb, source, device):
        return {"status": "ok", "mode": "train_step", "dtype": "float32", "remat": "none", "context": t, "batch": b,
                "memory_gb": gb, "memory_source": source, "device": device}

    cpu = [row(t, 4, (1e6 + 2e3 * t + 100 * t * t) / 1e9, "memory_analysis", "cpu") for t in (64, 128, 256, 512)]
    gpu = [row(t, 4, (5e6 + 1e3 * t + 50 * t * t) / 1e9, "compiled for h100-80gb", "h100") for t in (64, 128, 256, 512)]
    text, _ = fit_memory_context(cpu + gpu)
    parts = text.split("; ")
    assert len(parts) == 2, text
    assert "(XLA:CPU compiled estimate)" in parts[0] and "100 B·T²" in parts[0]
    # Each fit's T² share uses its own series: 100·512² / (1e6 + 2e3·512 + 100·512²) = 93 %.
    assert "term 93% of the total" in parts[0]
    assert "(compiled for h100-80gb)" in parts[1] and "50 B·T²" in parts[1]
    cpu = [row(256, b, (3e6 + 1e7 * b) / 1e9, "memory_analysis", "cpu") for b in (1, 2, 4)]
    gpu = [row(256, b, (9e6 + 4e6 * b) / 1e9, "compiled for h100-80gb", "h") for b in (1, 2, 4)]
    lines, _ = fit_memory_batch(cpu + gpu)
    assert len(lines.split("; ")) == 2 and "R² 1.0000" in lines.split("; ")[1]


def test_a_step_two_runs_measured_is_one_point_of_the_fit():
    """Issue 48: the batch sweep's and the context sweep's batch 4 at context 256 are one step, one point. On the
    line 10 + 2 B (MB) at B = 1, 2, 8, and B = 4 measured twice (18 and 20 MB): one point at 19 MB gives the slope
    2.0087 MB per sequence (1 2 4 8 against 12 14 19 26, least squares by hand); the two points would give 2.0139."""
    from deliverables.report.bench import fit_memory_points

    row = {"status": "ok", "mode": "train_step", "dtype": "float32", "remat": "none", "context": 256}
    pts = [{**row, "batch": b, "memory_gb": (10e6 + 2e6 * b) / 1e9, "run": "batch_sweep"} for b in (1, 2, 4, 8)]
    pts.append({**row, "batch": 4, "memory_gb": 20e6 / 1e9, "run": "memory_vs_context"})
    (xs, coef, ys), = fit_memory_points(pts, "batch", "context", 1).values()
    assert xs == [1, 2, 4, 8] and ys[2] == 19e6
    assert math.isclose(coef[1], 2.00870e6, rel_tol=1e-5)


def _lr_run(lr, seed, loss=None, acc=None, status="ok"):
    return {"name": f"lr{lr}-s{seed}", "status": status, "axes": {"optim.lr": lr, "seed": seed},
            "metrics": {"eval_loss": loss, "eval_acc": acc} if loss is not None else {},
            "reason": "loss nan at step 12" if status == "diverged" else None}


def test_a_run_far_above_the_best_failed_to_learn_though_below_ln_v():
    from deliverables.report.sections.divergence import divergence_section
    from deliverables.report.seeds import Setting

    # ln 4096 = 8.32: lr 0.2 ends at 6.0 nats (a nat above the best, 13 % accuracy against 20 %): not trained.
    table = {0.01: (5.08, 0.205), 0.05: (5.19, 0.19), 0.2: (6.01, 0.133), 0.5: (6.17, 0.118)}
    settings = [Setting(f"lr{lr}", {"optim.lr": lr}, [_lr_run(lr, s, loss + 0.01 * s, acc) for s in range(3)])
                for lr, (loss, acc) in table.items()]
    settings.append(Setting("lr30", {"optim.lr": 30.0}, [_lr_run(30.0, s, status="diverged") for s in range(3)]))
    text = "\n".join(divergence_section(settings, "optim.lr", math.log(4096)))
    row = next(line for line in text.splitlines() if line.startswith("| 0.2 |"))
    assert row.startswith("| 0.2 | 3 | 0 | 3 | 0 |"), row  # trained, failed to learn, diverged
    assert "every seed trained up to lr 0.05" in text and "no seed trained from lr 0.2" in text
    assert "non-finite for every seed at lr 30" in text
