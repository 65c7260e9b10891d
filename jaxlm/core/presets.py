"""Named model sizes, usable by every command as `--preset NAME` (a table, beside the config tree it fills)."""

from __future__ import annotations

from typing import Any

_SIZES = {  # d_model, d_ff, num_layers, num_heads
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


def _preset(d_model, d_ff, num_layers, num_heads, vocab_size=10000, context_length=1024) -> dict:
    return {"model": dict(vocab_size=vocab_size, context_length=context_length, d_model=d_model, d_ff=d_ff,
                          num_layers=num_layers, num_heads=num_heads)}


# Named model sizes, usable by every command as `--preset NAME`: the curriculum's profiling sizes
# (vocab 10000) and GPT-2's (vocab 50257, untied here as in docs/spec.md).
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tinystories-17M": _preset(512, 1344, 4, 16, context_length=256),
    **{name: _preset(*dims) for name, dims in _SIZES.items()},
    **{f"gpt2-{name}": _preset(*_SIZES[name], vocab_size=50257) for name in ("small", "medium", "large", "xl")},
}
