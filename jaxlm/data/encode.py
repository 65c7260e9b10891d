"""Text sources into one token file: documents cut into chunks at boundaries that do not change the
encoding, encoded in worker processes (for large inputs), written in order (`jaxlm/data/prepare.py`
builds the data directories with it)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from jaxlm.data.bpe import _bar, file_chunks, mp_context, read_chunk
from jaxlm.data.tokenizer import Tokenizer

PYDOC = "pydoc"  # a source name: Python's bundled documentation text (pydoc_data.topics)
_CHUNK_BYTES = 1 << 20
# Below this many input bytes one process encodes everything: starting workers costs more.
_PARALLEL_MIN_BYTES = 16 << 20


def pydoc_documents() -> list[str]:
    """Python's bundled docs (`pydoc_data.topics.topics`) in sorted key order: ~1 MB, no network."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _tasks(sources: Sequence[str], tokenizer: Tokenizer) -> list[tuple]:
    """(kind, payload..., last_of_document) tasks in output order."""
    specials = [s.encode() for s in tokenizer.special_tokens]
    tasks: list[tuple] = []
    for src in sources:
        if src == PYDOC:
            docs = pydoc_documents()
            tasks += [("text", d, len(d.encode()), True) for d in docs]
            continue
        chunks = file_chunks([Path(src)], specials, _CHUNK_BYTES)
        tasks += [("file", path, start, end, i == len(chunks) - 1) for i, (path, start, end) in enumerate(chunks)]
    return tasks


# --------------------------------------------------------------------------- workers

_WORKER: dict = {}


def _init_worker(tokenizer: Tokenizer, dtype: str) -> None:
    _WORKER["tok"], _WORKER["dtype"] = tokenizer, dtype


def _encode_task(task: tuple) -> np.ndarray:
    tok, dtype = _WORKER["tok"], _WORKER["dtype"]
    text = task[1] if task[0] == "text" else read_chunk(task[1], task[2], task[3])
    ids = tok.encode(text)
    if task[-1] and tok.eot_id is not None and not text.endswith("<|endoftext|>"):
        ids.append(tok.eot_id)  # end of a document
    return np.asarray(ids, dtype=dtype)


def _task_bytes(task: tuple) -> int:
    return task[2] if task[0] == "text" else task[3] - task[2]


def encode_to_file(sources: list[str], tokenizer: Tokenizer, dtype: np.dtype, path: Path, workers: int, progress: bool,
                   desc: str) -> int:
    """Encode `sources` in order into `path` (raw ids of `dtype`), in `workers` processes for large inputs; ids written."""
    tasks = _tasks(sources, tokenizer)
    total = sum(_task_bytes(t) for t in tasks)
    bar = _bar(total, desc, progress, unit="B")
    n, pool = 0, None
    try:
        with open(path, "wb") as f:
            if workers <= 1 or len(tasks) <= 1 or total < _PARALLEL_MIN_BYTES:
                _init_worker(tokenizer, dtype.name)
                results = map(_encode_task, tasks)
            else:
                pool = mp_context().Pool(min(workers, len(tasks)), initializer=_init_worker, initargs=(tokenizer, dtype.name))
                results = pool.imap(_encode_task, tasks)
            for task, ids in zip(tasks, results):
                ids.tofile(f)
                n += ids.size
                bar.update(_task_bytes(task))
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()  # ends the bar's line before any error message
    return n
