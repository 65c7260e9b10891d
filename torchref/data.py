"""Random training windows from a flat token array (docs/spec.md, "Data")."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch


def get_batch(
    x: npt.NDArray, batch_size: int, context_length: int, device: str | torch.device,
    rng: np.random.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x[i:i+m] and targets x[i+1:i+m+1] for batch_size offsets i uniform in 0..len(x)-m-1.

    Both are int64 on `device`; a device that does not exist raises (no silent CPU fallback).
    """
    if len(x) <= context_length:
        raise ValueError(f"dataset of {len(x)} tokens is too short for context_length {context_length}")
    device = torch.device(device)
    rng = rng if rng is not None else np.random.default_rng()
    starts = rng.integers(0, len(x) - context_length, size=batch_size)
    idx = starts[:, None] + np.arange(context_length + 1)[None, :]  # (B, m+1)
    window = torch.from_numpy(np.asarray(x[idx], dtype=np.int64))
    return window[:, :-1].to(device), window[:, 1:].to(device)
