"""Tokenise text files into a self-contained data directory (docs/spec.md#data).

Layout of a prepared directory::

    train.bin   flat token ids, raw uint16 (vocab_size <= 65536) or uint32, native little-endian
    val.bin     same, the validation split
    meta.json   dtype, vocab_size, tokenizer, eot_id, token counts, sources (written last)
    vocab.json, merges.txt, special_tokens.json   only for a tokenizer given as a directory, or `bpe:N`
                                                  (tokenizer.json, generation_config.json: a Hugging Face one)

Documents (input files, or the pieces of a file already separated by `<|endoftext|>`)
are joined with the `<|endoftext|>` id. Files are cut into chunks at boundaries that do
not change the encoding and encoded in worker processes; chunks are written in order.
Everything is built in a temporary sibling directory and moved into place only when
complete (meta.json last), so a failed or interrupted `prepare` leaves the target as
it was, and a directory with a meta.json is always complete. One `prepare` at a time
per target: it holds the target's lock (jaxlm.core.lock).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxlm.core.errors import DataError, WriteFailed
from jaxlm.core.files import atomic_write, writable_dir_problem
from jaxlm.core.lock import DirLock
from jaxlm.data.bpe import train_and_save
from jaxlm.data.chunks import file_chunks, mp_context, progress_bar, read_chunk
from jaxlm.data.corpora import CORPORA, resolve_sources
from jaxlm.data.maxid import scan_max, stamped_max_ids
from jaxlm.data.tokenizer import Tokenizer, load_tokenizer, trained_bpe_size

META = "meta.json"
FORMAT = "jaxlm-tokens/1"
PYDOC = "pydoc"  # a source name: Python's bundled documentation text (pydoc_data.topics)
BUILTIN_TOKENIZERS = ("bytes", "gpt2")

_CHUNK_BYTES = 1 << 20
# Below this many input bytes one process encodes everything: starting workers costs more.
_PARALLEL_MIN_BYTES = 16 << 20


def token_dtype(vocab_size: int, requested: str | None = None, where: str = "tokenizer") -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32; a requested dtype is checked."""
    auto = "uint16" if vocab_size <= 1 << 16 else "uint32"
    name = requested or auto
    if name not in ("uint16", "uint32"):
        raise DataError(f"dtype must be uint16 or uint32, got {name!r}")
    if vocab_size > np.iinfo(name).max + 1:
        raise DataError(f"{where}: vocab_size {vocab_size} does not fit in {name}; use uint32")
    return np.dtype(name)


# --------------------------------------------------------------------------- sources


def pydoc_documents() -> list[str]:
    """Python's bundled docs (`pydoc_data.topics.topics`) in sorted key order: ~1 MB, no network."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _check_sources(sources: Sequence[str], role: str) -> list[str]:
    """Corpus names resolved to their files (jaxlm.data.corpora), every file checked to exist."""
    if not sources:
        raise DataError(f"no {role} input files given")
    out = resolve_sources(sources)
    for s in out:
        if s != PYDOC and not Path(s).is_file():
            if Path(s).exists():
                raise DataError(f"{s}: not a file")
            corpus = "" if os.sep in s else f" and no corpus of that name (corpora: {', '.join(CORPORA)})"
            raise DataError(f"{s}: file not found{corpus}")
    return out


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


def _encode_to_file(sources: list[str], tokenizer: Tokenizer, dtype: np.dtype, path: Path, workers: int,
                    progress: bool, desc: str) -> int:
    tasks = _tasks(sources, tokenizer)
    total = sum(_task_bytes(t) for t in tasks)
    bar = progress_bar(total, desc, progress, unit="B")
    n, pool = 0, None
    try:
        with open(path, "wb") as f:
            if workers <= 1 or len(tasks) <= 1 or total < _PARALLEL_MIN_BYTES:
                _init_worker(tokenizer, dtype.name)
                results = map(_encode_task, tasks)
            else:
                pool = mp_context().Pool(min(workers, len(tasks)), _init_worker, (tokenizer, dtype.name))
                results = pool.imap(_encode_task, tasks)
            for task, ids in zip(tasks, results):
                f.write(ids.data)  # an OSError with its errno (tofile's short write has none)
                n += ids.size
                bar.update(_task_bytes(task))
    except OSError as e:
        e.filename = e.filename or str(path)  # name the file being written
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()  # ends the bar's line before any error message
    return n


# --------------------------------------------------------------------------- prepare


def prepare(
    inputs: Sequence[str],
    tokenizer: str,
    out: str | os.PathLike,
    val_fraction: float | None = 0.1,
    val_inputs: Sequence[str] | None = None,
    workers: int | None = None,
    dtype: str | None = None,
    progress: bool = True,
    culprit: str | None = None,
) -> dict:
    """Tokenise `inputs` (corpus names, paths or "pydoc") into `out`/train.bin + val.bin + meta.json; returns the meta.

    Validation: `val_inputs` when given, else the last `val_fraction` of the tokens. `tokenizer` "bpe:N"
    first trains a byte-level BPE of N entries on the training inputs (as `python -m jaxlm.data train-bpe`).
    Inputs are checked before anything is written; the files are built beside `out` and moved in when all
    are complete. `culprit` (default: `out`) names the target in a refusal."""
    t0 = time.perf_counter()
    inputs = _check_sources(inputs, "training")
    val_inputs = _check_sources(val_inputs, "validation") if val_inputs else None
    if val_inputs is None and not (val_fraction is not None and 0.0 < val_fraction < 1.0):
        raise DataError(f"val_fraction must be in (0, 1) when no validation files are given, got {val_fraction}")
    bpe_size = trained_bpe_size(tokenizer)
    if bpe_size and PYDOC in inputs:
        raise DataError(f"tokenizer {tokenizer!r}: trains on text files; '{PYDOC}' is not one")
    workers = (os.cpu_count() or 1) if workers is None else max(1, workers)
    out = Path(out)
    problem = writable_dir_problem(out)
    if problem:
        raise DataError(f"{out}: cannot hold the prepared data: {problem}")

    build = out.absolute().parent / f".{out.absolute().name}.prepare-{os.getpid()}"
    with DirLock(out, culprit or str(out)):  # the target is checked before the tokenizer (which may download)
        tok = None if bpe_size else load_tokenizer(tokenizer)
        _remove_stale_builds(build)
        created = [d for d in build.parents if not d.exists()]  # made here, removed again on failure
        try:
            build.mkdir(parents=True)
            source, tok, trained = _trained_tokenizer(build, inputs, bpe_size, workers, progress) if bpe_size else \
                (str(tokenizer), tok, {})
            np_dtype = token_dtype(tok.vocab_size, dtype, where=str(tokenizer))
            meta = _build(build, inputs, val_inputs, val_fraction, tok, source, np_dtype, workers, progress)
            if bpe_size:
                shutil.rmtree(build / "bpe")
                meta.update(tokenizer=str(tokenizer), bpe_train_seconds=round(trained["seconds"], 3))
            meta["seconds"] = round(time.perf_counter() - t0, 3)
            atomic_write(build / META, json.dumps(meta, indent=2) + "\n")
            _move_into(build, out)
        except BaseException as e:
            shutil.rmtree(build, ignore_errors=True)
            for d in created:  # innermost first
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
            if isinstance(e, OSError):  # a full disk, a quota, a file that vanished
                where = str(e.filename or out).replace(str(build), str(out))
                raise WriteFailed(f"{where}: preparing the data failed: {e.strerror or e}; {out} is unchanged; "
                                  "free space (or fix the file) and run again") from e
            raise
    return meta


def _trained_tokenizer(build: Path, inputs, bpe_size: int, workers, progress: bool):
    """A BPE of `bpe_size` entries trained on the inputs into build/bpe (copied beside the tokens by
    `_build` like any tokenizer directory): (its directory, the tokenizer, the training record)."""
    trained = train_and_save(inputs, bpe_size, ["<|endoftext|>"], build / "bpe", num_workers=workers, progress=progress)
    return str(build / "bpe"), load_tokenizer(build / "bpe"), trained


def _remove_stale_builds(build: Path) -> None:
    """Remove what a killed `prepare` of the same target left beside it (under the target's lock, so
    no other `prepare` of it is running)."""
    stem = build.name.rsplit("-", 1)[0]
    for old in build.parent.glob(f"{stem}-*") if build.parent.is_dir() else []:
        shutil.rmtree(old, ignore_errors=True)


def _build(build: Path, inputs, val_inputs, val_fraction, tok: Tokenizer, tokenizer: str, np_dtype, workers: int,
           progress: bool) -> dict:
    """train.bin, val.bin (and the tokenizer's files) in `build`; returns their meta (not yet written)."""
    train_path, val_path = build / "train.bin", build / "val.bin"
    n_all = _encode_to_file(inputs, tok, np_dtype, train_path, workers, progress, "tokenise")
    if n_all == 0:
        raise DataError(f"{', '.join(inputs)}: empty corpus (no text to tokenise)")
    if val_inputs is not None:
        n_val = _encode_to_file(val_inputs, tok, np_dtype, val_path, workers, progress, "tokenise val")
        if n_val == 0:
            raise DataError(f"{', '.join(val_inputs)}: empty validation corpus (no text to tokenise)")
        n_train = n_all
    else:
        n_val = max(1, int(round(n_all * val_fraction)))
        n_train = n_all - n_val
        if n_train < 1:
            raise DataError(f"{', '.join(inputs)}: only {n_all} tokens, too few to split into train and val")
        _split_tail(train_path, val_path, n_train, np_dtype)

    files: list[str] = []
    if tokenizer not in BUILTIN_TOKENIZERS:  # copy the tokenizer so the directory is self-contained
        for name in tok.files:
            if (Path(tokenizer) / name).is_file():
                shutil.copyfile(Path(tokenizer) / name, build / name)
        (build / "special_tokens.json").write_text(json.dumps(tok.special_tokens) + "\n")
        files = [name for name in (*tok.files, "special_tokens.json") if (build / name).is_file()]

    def describe(srcs):
        return [{"path": s, "bytes": sum(len(d.encode()) for d in pydoc_documents()) if s == PYDOC
                 else Path(s).stat().st_size} for s in srcs]

    return {
        "format": FORMAT,
        "dtype": np_dtype.name,
        "vocab_size": tok.vocab_size,
        "tokenizer": tokenizer,
        "tokenizer_files": files,
        "tokenizer_sha256": tok.digest(),
        "special_tokens": tok.special_tokens,
        "eot_id": tok.eot_id,
        "tokens": {"train": n_train, "val": n_val},
        "val_fraction": None if val_inputs is not None else val_fraction,
        "sources": {"train": describe(inputs), "val": describe(val_inputs) if val_inputs else "tail of train"},
        **stamped_max_ids({split: scan_max(build / f"{split}.bin", np_dtype) for split in SPLITS}, build),
    }


def _move_into(build: Path, out: Path) -> None:
    """Put the finished files of `build` in `out`: one rename when `out` is new; else file by file,
    the old meta.json removed first and the new one moved last (other files in `out` stay)."""
    if not out.exists():
        os.replace(build, out)
        return
    (out / META).unlink(missing_ok=True)
    for f in sorted(build.iterdir(), key=lambda f: f.name == META):
        os.replace(f, out / f.name)
    build.rmdir()


def _split_tail(src: Path, dst: Path, n_keep: int, dtype: np.dtype) -> None:
    """Move the tokens after `n_keep` from `src` to `dst` (copies only the tail)."""
    offset = n_keep * dtype.itemsize
    with open(src, "rb") as f, open(dst, "wb") as g:
        f.seek(offset)
        shutil.copyfileobj(f, g, 1 << 22)
    os.truncate(src, offset)


# --------------------------------------------------------------------------- reading back


def read_meta(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / META
    if not path.is_file():
        raise DataError(f"{path}: not found; create it with "
                        f"`python -m jaxlm.data prepare --input ... --out {data_dir}`")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not UTF-8, not JSON
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    for key in ("dtype", "vocab_size", "tokenizer", "tokens"):
        if key not in meta:
            raise DataError(f"{path}: missing key {key!r}")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise DataError(f"{path}: dtype {meta['dtype']!r}: token files are uint16 or uint32")
    return meta


def load_tokenizer_from_meta(data_dir: str | os.PathLike) -> Tokenizer:
    """The tokenizer a prepared directory was made with (its own copy when it has one)."""
    meta = read_meta(data_dir)
    tok = load_tokenizer(data_dir if meta.get("tokenizer_files") else meta["tokenizer"])
    if tok.vocab_size != meta["vocab_size"]:
        raise DataError(f"{Path(data_dir) / META}: vocab_size {meta['vocab_size']} but tokenizer "
                        f"{meta['tokenizer']!r} has {tok.vocab_size}")
    return tok


def tokens(data_dir: str | os.PathLike, split: str = "train") -> np.memmap:
    """The token ids of one split, memory-mapped read-only."""
    meta = read_meta(data_dir)
    path = Path(data_dir) / f"{split}.bin"
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    return np.memmap(path, dtype=meta["dtype"], mode="r")


SPLITS = ("train", "val")
def max_token_id(data_dir: str | os.PathLike, split: str = "train") -> int:
    """The largest token id in SPLIT.bin: meta.json's record when it was made for this very file
    (same size and mtime), else one memory-mapped scan, recorded in meta.json where writable."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    path = data_dir / f"{split}.bin"
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    known = {**meta.get("max_token_id", {})} if isinstance(meta.get("max_token_id"), dict) else {}
    stamps = {**meta.get("max_token_id_stamps", {})} if isinstance(meta.get("max_token_id_stamps"), dict) else {}
    fresh = stamped_max_ids({split: 0}, data_dir)["max_token_id_stamps"][split]
    if split in known and stamps.get(split) == fresh:
        return int(known[split])
    value = scan_max(path, meta["dtype"])
    with contextlib.suppress(OSError):  # a read-only data directory: scan again next time
        atomic_write(data_dir / META, json.dumps({**meta, "max_token_id": {**known, split: value},
                                                  "max_token_id_stamps": {**stamps, split: fresh}}, indent=2) + "\n")
    return value


def _same_tokenizer(meta: dict, spec: str) -> bool:
    if spec in BUILTIN_TOKENIZERS or meta["tokenizer"] in BUILTIN_TOKENIZERS or trained_bpe_size(spec):
        return spec == meta["tokenizer"]
    if not Path(spec).is_dir():
        return spec == meta["tokenizer"]
    return load_tokenizer(spec).digest() == meta.get("tokenizer_sha256")


def ensure_prepared(data_cfg, progress: bool = True) -> Path:
    """The prepared directory of a `jaxlm.core.config.DataConfig`, tokenising `source` first if needed."""
    d = Path(data_cfg.dir)
    if (d / META).is_file():
        meta = read_meta(d)
        if not _same_tokenizer(meta, data_cfg.tokenizer):
            raise DataError(f"{d}: prepared with tokenizer {meta['tokenizer']!r} but data.tokenizer is "
                            f"{data_cfg.tokenizer!r}; delete {d} or point data.dir elsewhere")
        return d
    if not data_cfg.source:
        raise DataError(f"{d / META}: not found, and data.source is empty, so there is nothing to prepare; "
                        "set data.source, or data.dir to a prepared directory")
    _check_sources(data_cfg.source, "training")  # a missing corpus fails before any output
    if val := list(data_cfg.val_source) or None:
        _check_sources(val, "validation")
    print(f"[jaxlm.data] preparing {d} from {', '.join(map(str, data_cfg.source))} with tokenizer "
          f"{data_cfg.tokenizer!r}", file=sys.stderr)
    meta = prepare(list(data_cfg.source), data_cfg.tokenizer, d, val_fraction=None if val else data_cfg.val_fraction,
                   val_inputs=val, progress=progress, culprit=f"data.dir = {str(d)!r}")
    print(f"[jaxlm.data] {d}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens "
          f"({meta['seconds']} s)", file=sys.stderr)
    return d
