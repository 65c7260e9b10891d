"""Batches from a prepared token directory (docs/spec.md#data): numpy and grain, no jax.

Training batches are random windows. The global batch of step s is a pure function of
(seed, s): its offsets come from `np.random.default_rng([seed, s])`, uniform in
0 .. len - context_length - 1. Process p of P keeps rows [p*B/P, (p+1)*B/P), so the
processes' rows concatenate to the single-process batch, and an iterator started at
`start_step` yields exactly what an uninterrupted one would have from that step on:
resuming needs only the step number.

The token file is memory-mapped lazily in whichever process reads it; pickling a
source carries only its path, so grain worker processes open their own map.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import grain
import numpy as np

from jaxlm.core.errors import DataError
from jaxlm.data.prepare import read_meta


def get_batch(x: np.ndarray, batch_size: int, context_length: int, rng: np.random.Generator | int | None = None,
              dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """`get_batch` of docs/spec.md on a numpy array or memmap: offsets i uniform in 0 .. len(x)-m-1,
    inputs x[i:i+m], targets x[i+1:i+m+1], both (batch_size, m) of `dtype`."""
    if len(x) <= context_length:
        raise ValueError(f"need more than context_length={context_length} tokens, got {len(x)}")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    offsets = rng.integers(0, len(x) - context_length, size=batch_size)
    w = _windows(x, offsets, context_length, dtype)
    return w[:, :-1], w[:, 1:]


def _windows(x: np.ndarray, offsets: np.ndarray, context_length: int, dtype) -> np.ndarray:
    """(len(offsets), context_length + 1) windows x[i : i + m + 1]."""
    out = np.empty((len(offsets), context_length + 1), dtype=dtype)
    for row, i in enumerate(offsets.tolist()):
        out[row] = x[i : i + context_length + 1]
    return out


class TokenWindows:
    """Random-access source (grain protocol) of the (context_length + 1)-token windows of a split.

    Record i is tokens[i : i + context_length + 1] as int32, for i in 0 .. len - m - 1.
    """

    def __init__(self, path: str | os.PathLike, dtype: str, context_length: int):
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.context_length = context_length
        self.num_tokens = os.path.getsize(self.path) // self.dtype.itemsize
        if self.num_tokens <= context_length:
            raise DataError(f"{self.path}: {self.num_tokens} tokens, need more than context_length={context_length}")
        self._tokens: np.memmap | None = None

    @classmethod
    def from_dir(cls, data_dir: str | os.PathLike, split: str, context_length: int) -> "TokenWindows":
        meta = read_meta(data_dir)
        path = Path(data_dir) / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        return cls(path, meta["dtype"], context_length)

    @property
    def tokens(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        return self.num_tokens - self.context_length

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[i : i + self.context_length + 1], dtype=np.int32)

    def gather(self, offsets: np.ndarray) -> np.ndarray:
        return _windows(self.tokens, offsets, self.context_length, np.int32)

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}

    def __repr__(self):
        return f"TokenWindows({self.path!r}, dtype={self.dtype.name}, context_length={self.context_length})"


def step_offsets(seed: int, step: int, num_offsets: int, batch_size: int) -> np.ndarray:
    """The global batch's window offsets at `step`: a pure function of (seed, step)."""
    return np.random.default_rng([seed, step]).integers(0, num_offsets, size=batch_size)


class _StepBatch:
    """grain map: global step -> this process's (x, y) rows of the global batch."""

    def __init__(self, source: TokenWindows, seed: int, batch_size: int, rows: slice):
        self.source, self.seed, self.batch_size, self.rows = source, seed, batch_size, rows

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        offsets = step_offsets(self.seed, step, len(self.source), self.batch_size)[self.rows]
        w = self.source.gather(offsets)
        return w[:, :-1], w[:, 1:]


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if batch_size % process_count:
        raise ValueError(f"batch_size {batch_size} is not divisible by process_count {process_count}")
    per = batch_size // process_count
    return slice(process_index * per, (process_index + 1) * per)


def check_ids(window: np.ndarray, vocab_size: int, path: str, where: str) -> None:
    """Every id of a batch below the tokenizer's vocabulary (a max over B x T ids: nothing beside a step). The
    preflight scan is skipped for a file whose size and mtime match its record, so an edited file shows here,
    before an out-of-range id gathers a NaN embedding."""
    top = int(window.max()) if window.size else -1
    if top >= vocab_size:
        raise DataError(f"{path}: {where} holds token id {top}, but the tokenizer has {vocab_size} ids (meta.json); "
                        "the file changed after it was prepared: prepare the data again")


class Batches:
    """Iterator of (x, y) int32 arrays; `step` is the global step of the next batch."""

    def __init__(self, iterator, start_step: int, source: TokenWindows | None = None, vocab_size: int | None = None):
        self._it = iterator
        self.step = start_step
        self._path, self._vocab = (source.path if source else ""), vocab_size

    def __iter__(self):
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        batch = next(self._it)
        for ids in batch if self._vocab is not None else ():
            check_ids(ids, self._vocab, self._path, f"the batch of step {self.step + 1}")
        self.step += 1
        return batch

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


_MAX_STEPS = 1 << 62


def train_batches(
    data_dir: str | os.PathLike,
    batch_size: int,
    context_length: int,
    seed: int,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    num_workers: int = 0,
    prefetch: int = 2,
    split: str = "train",
) -> Batches:
    """Endless random-window batches of shape (batch_size // process_count, context_length).

    A grain pipeline: `MapDataset.range(start_step, ...)` of global steps, mapped to
    batches, read by `prefetch` threads (and `num_workers` processes when > 0).
    """
    source = TokenWindows.from_dir(data_dir, split, context_length)
    rows = process_rows(batch_size, process_index, process_count)
    ds = grain.MapDataset.range(start_step, _MAX_STEPS).map(_StepBatch(source, seed, batch_size, rows))
    threads = max(1, prefetch)
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=threads, prefetch_buffer_size=max(1, prefetch)))
    if num_workers > 0:
        _absl_flags_parsed()
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers,
                                                                per_worker_buffer_size=max(1, prefetch)))
    return Batches(iter(it_ds), start_step, source, read_meta(data_dir).get("vocab_size"))


def _absl_flags_parsed() -> None:
    """grain's worker processes read absl flags; outside an absl app nobody parsed them."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def scored_tokens(split_tokens: int, eval_tokens: int) -> int:
    """Targets an evaluation scores: `eval_tokens`, or every target of the split (its length - 1)
    when that is fewer or `eval_tokens` is 0."""
    return split_tokens - 1 if eval_tokens == 0 else min(eval_tokens, split_tokens - 1)


def eval_batches(
    data_dir: str | os.PathLike,
    split: str,
    batch_size: int,
    context_length: int,
    eval_tokens: int = 0,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A fixed set of validation targets, the same for every batch size and context length.

    The N = `scored_tokens` targets x[1 .. N] are scored once each: windows of m = context_length
    laid end to end from token 0 (window j: inputs x[jm : jm+m], targets x[jm+1 : jm+m+1]), the last
    cut at target N, batched `batch_size` windows at a time, the last batch filled with empty windows.
    Target t is predicted from the (t-1) mod m + 1 tokens before it in its window, so only that
    context changes with m. Yields int32 inputs and targets and a float32 mask (1 = scored), each
    (batch_size // process_count, m): this process's rows of every global batch.
    """
    source, vocab = TokenWindows.from_dir(data_dir, split, context_length), read_meta(data_dir)["vocab_size"]
    m, n = context_length, scored_tokens(source.num_tokens, eval_tokens)
    rows = process_rows(batch_size, process_index, process_count)
    num_windows = -(-n // m)
    for lo in range(0, num_windows, batch_size):
        w = np.zeros((batch_size, m + 1), np.int32)  # (B, m + 1)
        mask = np.zeros((batch_size, m), np.float32)  # (B, m)
        for row, start in enumerate(range(lo * m, min(lo + batch_size, num_windows) * m, m)):
            seg = source.tokens[start : min(start + m, n) + 1]
            w[row, : len(seg)] = seg
            mask[row, : len(seg) - 1] = 1.0
        check_ids(w, vocab, source.path, f"the evaluation windows from token {lo * m}")
        yield w[rows, :-1], w[rows, 1:], mask[rows]
