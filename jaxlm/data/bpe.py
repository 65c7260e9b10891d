"""Byte-level BPE training (docs/spec.md#tokenizer) and the GPT-2 vocab.json / merges.txt format.

Training has two phases:

1. Pre-tokenisation, in parallel worker processes: the input is cut into chunks (`jaxlm.data.chunks`) at boundaries
   where cutting cannot change the result (the start of a special token, or a whitespace character that follows a
   non-whitespace one), each worker splits its chunk on the special tokens, runs the GPT-2 regex and counts.
2. Merging, in this process: every distinct pre-token is a list of token ids with a frequency. Pair counts live
   in a dict, the words containing each pair in an index, and the best pair comes from a max-heap with lazy
   invalidation. A merge only touches the words that contain the merged pair.

Vocabulary ids: the special tokens first (0, 1, ...), then the 256 single bytes in GPT-2's byte-to-unicode
order (the order of GPT-2's own vocabulary and of the CS336 reference files), then one id per merge in order.
Imports nothing heavy (no jax, no grain, no numpy).
"""

from __future__ import annotations

import heapq
import json
import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import regex

from jaxlm.core.errors import DataError
from jaxlm.core.files import atomic_write, writable_dir_problem
from jaxlm.data.chunks import file_chunks, mp_context, progress_bar, read_chunk

# GPT-2's pre-tokenisation pattern (docs/spec.md#tokenizer) (tiktoken's "gpt2" uses the same one).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PRETOKEN_RE = regex.compile(GPT2_PATTERN)

# Chunks handed to each pre-tokenisation worker are about this big (bytes).
_CHUNK_BYTES = 1 << 20
# Inputs smaller than this are pre-tokenised in this process (starting workers costs more).
_PARALLEL_MIN_BYTES = 2 << 20


# --------------------------------------------------------------------------- GPT-2 byte <-> unicode


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters.

    Printable Latin-1 bytes map to themselves; the others (control characters, space,
    a few Latin-1 gaps) are shifted to 256, 257, ... in byte order. The insertion order
    of the returned dict (printable bytes first) is the order of GPT-2's first 256 ids.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# The 256 byte values in GPT-2 id order.
BYTE_ORDER: tuple[int, ...] = tuple(_BYTE_TO_CHAR)


def token_to_str(token: bytes) -> str:
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def str_to_token(text: str, where: str = "") -> bytes:
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in text)
    except KeyError as e:
        raise DataError(f"{where}: {text!r} is not a GPT-2 byte-encoded token (character {e.args[0]!r})") from None


# --------------------------------------------------------------------------- save / load


def save_vocab_merges(directory: str | os.PathLike, vocab: dict[int, bytes],
                      merges: Sequence[tuple[bytes, bytes]]) -> tuple[Path, Path]:
    """Write GPT-2 style `vocab.json` (byte-encoded token -> id) and `merges.txt` into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    encoded = {token_to_str(tok): i for i, tok in sorted(vocab.items())}
    if len(encoded) != len(vocab):
        raise DataError(f"{vocab_path}: vocabulary has duplicate tokens; vocab.json cannot represent them")
    atomic_write(vocab_path, json.dumps(encoded, ensure_ascii=False, indent=0) + "\n")
    lines = ["#version: 0.2"] + [f"{token_to_str(a)} {token_to_str(b)}" for a, b in merges]
    atomic_write(merges_path, "\n".join(lines) + "\n")
    return vocab_path, merges_path


def load_vocab_merges(vocab_path: str | os.PathLike,
                      merges_path: str | os.PathLike) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Read GPT-2 style `vocab.json` + `merges.txt` (with or without the `#version` header)."""
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    for p in (vocab_path, merges_path):
        if not p.is_file():
            raise DataError(f"{p}: file not found")
    try:
        encoded = json.loads(vocab_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{vocab_path}: not a JSON vocabulary ({e})") from None
    vocab = {int(i): str_to_token(s, str(vocab_path)) for s, i in encoded.items()}
    merges = []
    for lineno, line in enumerate(merges_path.read_text(encoding="utf-8").split("\n"), 1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise DataError(f"{merges_path}:{lineno}: expected two space-separated tokens, got {line!r}")
        merges.append((str_to_token(parts[0], str(merges_path)), str_to_token(parts[1], str(merges_path))))
    return vocab, merges


# --------------------------------------------------------------------------- pre-tokenisation


def special_split_re(special_tokens: Iterable[str]):
    """Alternation of escaped specials, longest first, so overlapping ones resolve longest-first."""
    specials = sorted(set(special_tokens), key=lambda s: (-len(s), s))
    if not specials:
        return None
    return regex.compile("|".join(regex.escape(s) for s in specials))


def _count_pretokens(args) -> Counter:
    path, start, end, special_tokens = args
    text = read_chunk(path, start, end)
    split = special_split_re(special_tokens)
    pieces = split.split(text) if split else [text]
    counts: Counter = Counter()
    for piece in pieces:
        counts.update(_PRETOKEN_RE.findall(piece))
    return counts


def count_pretokens(paths: Sequence[Path], special_tokens: Sequence[str], num_workers: int | None = None,
                    progress: bool = False) -> Counter:
    """Pre-token string -> frequency over all files, special tokens removed."""
    specials_b = [s.encode("utf-8") for s in special_tokens]
    total = sum(p.stat().st_size for p in paths)
    if num_workers is None:
        num_workers = os.cpu_count() or 1
    chunk_bytes = _CHUNK_BYTES if total < 64 * _CHUNK_BYTES else 8 * _CHUNK_BYTES
    if num_workers > 1 and total >= _PARALLEL_MIN_BYTES:
        chunk_bytes = min(chunk_bytes, max(total // (4 * num_workers), 1 << 16))
    tasks = [(*c, list(special_tokens)) for c in file_chunks(paths, specials_b, chunk_bytes)]
    counts: Counter = Counter()
    bar = progress_bar(total, "pre-tokenise", progress, unit="B")
    try:
        if num_workers <= 1 or total < _PARALLEL_MIN_BYTES or len(tasks) == 1:
            for t in tasks:
                counts.update(_count_pretokens(t))
                bar.update(t[2] - t[1])
        else:
            with mp_context().Pool(min(num_workers, len(tasks))) as pool:
                for t, c in zip(tasks, pool.imap(_count_pretokens, tasks)):
                    counts.update(c)
                    bar.update(t[2] - t[1])
    finally:
        bar.close()  # ends the bar's line before any error message
    return counts


# --------------------------------------------------------------------------- merging


def _inverted_key(token: bytes) -> str:
    """A string whose ascending order is the descending order of byte strings.

    Each byte b becomes chr(255 - b) and a terminator chr(256) (greater than any of them)
    ends the string, so a proper prefix (the smaller byte string) sorts after its
    extensions. Keys are prefix-free, so concatenating two keys orders pairs correctly.
    """
    return "".join(chr(255 - b) for b in token) + "\u0100"


def train_bpe(
    input_path: str | os.PathLike | Sequence[str | os.PathLike],
    vocab_size: int,
    special_tokens: Sequence[str] = (),
    num_workers: int | None = None,
    progress: bool = False,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE tokenizer on one or more UTF-8 text files (each file is a document).

    Returns `vocab` (id -> token bytes: specials, then the 256 bytes, then merges) and
    `merges` in creation order. Ties between equally frequent pairs go to the
    lexicographically greater pair of byte strings.
    """
    paths = [Path(input_path)] if isinstance(input_path, (str, os.PathLike)) else [Path(p) for p in input_path]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: file not found")
    special_tokens = list(dict.fromkeys(special_tokens))
    base = len(special_tokens) + 256
    if vocab_size < base:
        raise DataError(f"vocab_size {vocab_size} is smaller than {len(special_tokens)} special tokens + 256 bytes")

    vocab: dict[int, bytes] = {i: s.encode("utf-8") for i, s in enumerate(special_tokens)}
    byte_id = [0] * 256
    for b in BYTE_ORDER:
        byte_id[b] = len(vocab)
        vocab[len(vocab)] = bytes([b])

    counts = count_pretokens(paths, special_tokens, num_workers, progress)
    words: list[list[int]] = []
    freqs: list[int] = []
    for text, f in counts.items():
        ids = [byte_id[b] for b in text.encode("utf-8")]
        if len(ids) > 1:
            words.append(ids)
            freqs.append(f)
    del counts

    merges = _merge(words, freqs, vocab, vocab_size, progress)
    return vocab, merges


def _merge(words: list[list[int]], freqs: list[int], vocab: dict[int, bytes], vocab_size: int,
           progress: bool) -> list[tuple[bytes, bytes]]:
    """Run merges in place on `words`, adding tokens to `vocab` until it has vocab_size entries."""
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for pair in zip(w, w[1:]):
            pair_counts[pair] += f
            where[pair].add(wi)
    pair_counts = dict(pair_counts)

    keys = [_inverted_key(vocab[i]) for i in range(len(vocab))]
    heap = [(-c, keys[a] + keys[b], a, b) for (a, b), c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[bytes, bytes]] = []
    bar = progress_bar(vocab_size - len(vocab), "merge", progress)

    while len(vocab) < vocab_size and heap:
        neg, _, a, b = heapq.heappop(heap)
        current = pair_counts.get((a, b), 0)
        if current != -neg:
            # Stale entry. A count that went down gets its fresh entry now; one that
            # went up already has a higher entry in the heap.
            if 0 < current < -neg:
                heapq.heappush(heap, (-current, keys[a] + keys[b], a, b))
            continue

        new = len(vocab)
        vocab[new] = vocab[a] + vocab[b]
        keys.append(_inverted_key(vocab[new]))
        merges.append((vocab[a], vocab[b]))
        bar.update()

        for pair, d in _rewrite_words(words, freqs, where, (a, b), new).items():
            if d == 0:
                continue
            c = pair_counts.get(pair, 0) + d
            if c > 0:
                pair_counts[pair] = c
            else:
                pair_counts.pop(pair, None)
            if d > 0:
                heapq.heappush(heap, (-c, keys[pair[0]] + keys[pair[1]], pair[0], pair[1]))
        pair_counts.pop((a, b), None)

    bar.close()
    return merges


def _rewrite_words(words: list[list[int]], freqs: list[int], where: dict[tuple[int, int], set[int]],
                   pair: tuple[int, int], new: int) -> dict[tuple[int, int], int]:
    """Replace `pair` by token `new` in every word holding it (in place, `where` updated); the pair counts' changes."""
    a, b = pair
    delta: dict[tuple[int, int], int] = defaultdict(int)
    for wi in where.pop(pair, ()):
        w = words[wi]
        n = len(w)
        merged: list[int] = []
        i = 0
        while i < n:
            if i + 1 < n and w[i] == a and w[i + 1] == b:
                merged.append(new)
                i += 2
            else:
                merged.append(w[i])
                i += 1
        if len(merged) == n:  # the index is lazy: this word no longer has the pair
            continue
        f = freqs[wi]
        for p in zip(w, w[1:]):
            delta[p] -= f
        for p in zip(merged, merged[1:]):
            delta[p] += f
            if new in p:
                where[p].add(wi)
        words[wi] = merged
    return delta


def train_and_save(inputs: Sequence[str], vocab_size: int, special_tokens: Sequence[str], out: str | os.PathLike,
                   num_workers: int | None = None, progress: bool = True) -> dict:
    """CLI helper: train, write vocab.json + merges.txt + special_tokens.json, return timings."""
    problem = writable_dir_problem(out)
    if problem:  # before the training, not after it
        raise DataError(f"{out}: cannot hold the tokenizer files: {problem}")
    t0 = time.perf_counter()
    vocab, merges = train_bpe(inputs, vocab_size, special_tokens, num_workers=num_workers, progress=progress)
    seconds = time.perf_counter() - t0
    if len(vocab) < vocab_size:  # the corpus ran out of pairs to merge: a smaller vocabulary than asked for
        raise DataError(f"vocab_size {vocab_size}: {', '.join(map(str, inputs))} yields only {len(vocab)} tokens "
                        f"({len(merges)} merges, then no pair is left to merge); give it more text or ask for at "
                        f"most {len(vocab)}")
    out = Path(out)
    save_vocab_merges(out, vocab, merges)
    atomic_write(out / "special_tokens.json", json.dumps(list(special_tokens)) + "\n")
    mb = sum(Path(p).stat().st_size for p in inputs) / 1e6
    return {"seconds": seconds, "megabytes": mb, "vocab_size": len(vocab), "merges": len(merges), "out": str(out)}
