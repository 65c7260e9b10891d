"""Save and restore model + optimizer + iteration; loading never unpickles arbitrary code."""

from __future__ import annotations

import os
from typing import IO, BinaryIO

import torch


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, iteration: int,
                    out: str | os.PathLike | BinaryIO | IO[bytes]) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": int(iteration)}
    torch.save(state, out)


def load_checkpoint(src: str | os.PathLike | BinaryIO | IO[bytes], model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> int:
    """Restore both states in place and return the saved iteration (weights_only: tensors and plain data only)."""
    state = torch.load(src, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["iteration"])
