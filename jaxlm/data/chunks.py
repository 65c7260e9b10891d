"""Text files cut into byte ranges for parallel workers, where a cut changes no pre-token (the start of a special
token, or a space or newline after a printable ASCII character: docs/spec.md#tokenizer), and read back; the
workers' start method; the progress bar of the data commands. BPE training (`bpe`) and token-file preparation
(`prepare`) share them. Imports nothing heavy (no jax, no grain, no numpy).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path
from typing import Sequence

from jaxlm.core.errors import DataError


def mp_context():
    """fork where it is safe (Linux, no JAX threads in this process), else spawn."""
    if sys.platform == "linux" and "jax" not in sys.modules:
        return mp.get_context("fork")
    return mp.get_context("spawn")


def _is_safe_cut(data: bytes, j: int) -> bool:
    # A space or newline right after a printable ASCII character: the pre-token regex
    # ends a token there whatever follows (see module docstring of tokenizer.py).
    return data[j] in (0x20, 0x0A) and 0x21 <= data[j - 1] <= 0x7E


def find_boundary(f, pos: int, size: int, specials: Sequence[bytes], window: int = 1 << 16) -> int:
    """The first position >= pos in open binary file `f` where the text may be cut.

    A cut is safe at the start of a special token, or (when no special token is near)
    at a whitespace byte following a printable ASCII byte. Returns `size` when none.
    """
    longest = max((len(s) for s in specials), default=0)
    while pos < size:
        f.seek(max(pos - longest, 0))
        data = f.read(window + 2 * longest)
        base = max(pos - longest, 0)
        lo, hi = pos - base, min(len(data), pos - base + window)
        hits = [i for s in specials if (i := data.find(s, lo, hi + longest)) != -1 and i < hi]
        if hits:
            return base + min(hits)
        for j in range(max(lo, 1), hi):
            if _is_safe_cut(data, j) and not any(_covers(data, s, j) for s in specials):
                return base + j
        pos += window
    return size


def _covers(data: bytes, special: bytes, j: int) -> bool:
    """Whether an occurrence of `special` in `data` strictly contains position j."""
    start = max(j - len(special) + 1, 0)
    i = data.find(special, start, j + len(special))
    return i != -1 and i < j


def file_chunks(paths: Sequence[Path], specials: Sequence[bytes],
                chunk_bytes: int) -> list[tuple[str, int, int]]:
    """Split each file into (path, start, end) byte ranges at safe boundaries."""
    chunks = []
    for path in paths:
        size = path.stat().st_size
        with open(path, "rb") as f:
            start = 0
            while start < size:
                end = find_boundary(f, start + chunk_bytes, size, specials) if start + chunk_bytes < size else size
                chunks.append((str(path), start, end))
                start = end
    return chunks


def read_chunk(path: str, start: int, end: int) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 at byte {start + e.start} ({e.reason})") from None


def progress_bar(total, desc: str, enabled: bool, **kw):
    """A tqdm bar on stderr (disabled: nothing shown), shared by the data commands' long passes."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, unit_scale=True, disable=not enabled, **kw)
