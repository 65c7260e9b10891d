"""Byte-level BPE tokenizer on top of tiktoken (docs/spec.md#tokenizer).

`Tokenizer(vocab, merges, special_tokens)` turns a vocabulary (id -> bytes) and its
merges into a `tiktoken.Encoding`: tiktoken applies merges by rank, so each merged
token's rank must follow merge order. When the vocabulary's ids already do (our
trained vocabularies, GPT-2's), ranks are the ids and tiktoken's output needs no
translation; otherwise ranks are renumbered and mapped back to ids.

Special tokens are split out here, in Python, with one regex alternation sorted
longest first (so `<|endoftext|><|endoftext|>` beats `<|endoftext|>`), and only the
text between them goes to tiktoken's `encode_ordinary`.

Streaming (`encode_iterable`) cuts the buffered text only where cutting cannot change
the result: at a space or newline that follows a non-whitespace character. Every
alternative of the GPT-2 pattern that matches a non-whitespace character stops before
whitespace (the optional space is only ever leading), so a pre-token ends there in the
whole text too, and the whitespace-run alternatives never reach back across a
non-whitespace character. The cut also stays clear of special tokens.

Imports nothing heavy (tiktoken, regex; no jax, no grain, no numpy).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import tiktoken

from jaxlm.core.errors import DataError
from jaxlm.data.bpe import GPT2_PATTERN, load_vocab_merges, special_split_re
from jaxlm.data.corpora import data_root
from jaxlm.data.hf_tokenizer import HFTokenizer, is_hf_tokenizer

EOT = "<|endoftext|>"
# encode_iterable encodes its buffer once it holds this many characters.
_STREAM_CHUNK_CHARS = 1 << 14


class Tokenizer:
    """Byte-level BPE: `encode`, `decode`, `encode_iterable`; ids are the vocabulary's ids."""

    def __init__(self, vocab: dict[int, bytes], merges: Sequence[tuple[bytes, bytes]],
                 special_tokens: Sequence[str] | None = None):
        self._vocab = dict(vocab)
        self._merges = list(merges)
        self.special_tokens = list(dict.fromkeys(special_tokens or []))
        first_id: dict[bytes, int] = {}
        for i in sorted(self._vocab):
            first_id.setdefault(self._vocab[i], i)
        # Special tokens missing from the vocabulary get the next free ids.
        self.special_ids: dict[str, int] = {}
        for s in self.special_tokens:
            b = s.encode("utf-8")
            if b not in first_id:
                first_id[b] = max(self._vocab, default=-1) + 1
                self._vocab[first_id[b]] = b
            self.special_ids[s] = first_id[b]
        self.spec: str | None = None  # how load_tokenizer named it ("gpt2", "bytes", a directory)

        ranks, rank_to_id = _mergeable_ranks(first_id, self._merges)
        self._rank_to_id = rank_to_id  # None: rank == id
        self._enc = tiktoken.Encoding(name="jaxlm-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
        size = max(self._vocab) + 1
        self._decoder: list[bytes] = [b""] * size
        for i, tok in self._vocab.items():
            self._decoder[i] = tok
        self._special_re = special_split_re(self.special_tokens)
        self._longest_special = max((len(s) for s in self.special_tokens), default=0)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_files(cls, vocab_path: str | os.PathLike, merges_path: str | os.PathLike,
                   special_tokens: Sequence[str] | None = None) -> "Tokenizer":
        vocab, merges = load_vocab_merges(vocab_path, merges_path)
        return cls(vocab, merges, special_tokens)

    def __getstate__(self):
        return {"vocab": self._vocab, "merges": self._merges, "special_tokens": self.special_tokens, "spec": self.spec}

    def __setstate__(self, state):
        self.__init__(state["vocab"], state["merges"], state["special_tokens"])
        self.spec = state["spec"]

    def __repr__(self):
        return f"Tokenizer(spec={self.spec!r}, vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (the embedding table's size)."""
        return len(self._decoder)

    @property
    def eot_id(self) -> int | None:
        return self.special_ids.get(EOT)

    @property
    def stop_ids(self) -> list[int]:
        """The ids that end a generation: <|endoftext|>'s, when there is one."""
        return [] if self.eot_id is None else [self.eot_id]

    bos_id = None  # no sequence starts with a BOS token (a Hugging Face tokenizer's may: jaxlm/data/hf_tokenizer.py)
    files = ("vocab.json", "merges.txt")  # what a tokenizer directory of this kind holds (with special_tokens.json)

    def digest(self) -> str:
        """SHA-256 of the vocabulary, merges and special tokens: equal digests encode identically."""
        h = hashlib.sha256()
        for i, tok in sorted(self.vocab.items()):
            h.update(i.to_bytes(4, "little") + len(tok).to_bytes(2, "little") + tok)
        for a, b in self.merges:
            h.update(len(a).to_bytes(2, "little") + a + len(b).to_bytes(2, "little") + b)
        h.update(json.dumps(self.special_tokens).encode())
        return h.hexdigest()

    @property
    def vocab(self) -> dict[int, bytes]:
        return dict(self._vocab)

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        return list(self._merges)

    # ------------------------------------------------------------------ encode / decode

    def _encode_ordinary(self, text: str) -> list[int]:
        ranks = self._enc.encode_ordinary(text)
        if self._rank_to_id is None:
            return ranks
        table = self._rank_to_id
        return [table[r] for r in ranks]

    def encode(self, text: str) -> list[int]:
        if self._special_re is None:
            return self._encode_ordinary(text)
        ids: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                ids += self._encode_ordinary(text[pos : m.start()])
            ids.append(self.special_ids[m.group()])
            pos = m.end()
        if pos < len(text):
            ids += self._encode_ordinary(text[pos:])
        return ids

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        decoder = self._decoder
        try:
            return b"".join([decoder[i] for i in ids])
        except (IndexError, TypeError):
            bad = next(i for i in ids
                       if not (isinstance(i, int) or hasattr(i, "__index__")) or not 0 <= int(i) < len(decoder))
            raise ValueError(f"token id {bad!r} is outside the vocabulary (size {len(decoder)})") from None

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text; byte sequences that are not valid UTF-8 become U+FFFD."""
        if hasattr(ids, "tolist"):  # numpy arrays: plain ints index lists fastest
            ids = ids.tolist()
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Stream ids for an iterable of strings (an open text file yields lines).

        Memory stays bounded by the chunk size whatever the input length, and the ids
        equal `encode("".join(iterable))`.
        """
        buf = ""
        check_at = _STREAM_CHUNK_CHARS
        for piece in iterable:
            buf += piece
            if len(buf) >= check_at:
                cut = self._safe_cut(buf)
                if cut > 0:
                    yield from self.encode(buf[:cut])
                    buf = buf[cut:]
                # Text with no cut point (no spaces) waits until the buffer doubles: linear time.
                check_at = max(_STREAM_CHUNK_CHARS, 2 * len(buf)) if cut == 0 else _STREAM_CHUNK_CHARS
        if buf:
            yield from self.encode(buf)

    def _safe_cut(self, buf: str) -> int:
        """The largest position at which `buf` can be cut without changing its encoding (0: none).

        Positions within `longest special` of the end are not considered: a special
        token there may still be incomplete.
        """
        limit = len(buf) - self._longest_special
        start = 0  # ordinary text between the last special token before `limit` and `limit`
        if self._special_re is not None:
            for m in self._special_re.finditer(buf):
                if m.start() >= limit:
                    break
                if m.end() > limit:
                    limit = m.start()
                    break
                start = m.end()
        j = limit - 1
        while j > start:
            ch = buf[j]
            if (ch == " " or ch == "\n") and not buf[j - 1].isspace():
                return j
            j -= 1
        return start


def _mergeable_ranks(first_id: dict[bytes, int],
                     merges: Sequence[tuple[bytes, bytes]]) -> tuple[dict[bytes, int], list[int] | None]:
    """tiktoken ranks for the 256 bytes and every merge result, plus rank -> id when they differ.

    Tokens that are neither single bytes nor merge results (special tokens, strays)
    get no rank: tiktoken never produces them from text.
    """
    for b in range(256):
        if bytes([b]) not in first_id:
            raise DataError(f"vocabulary lacks the single byte {bytes([b])!r}; a byte-level BPE needs all 256")
    results = []
    for a, b in merges:
        tok = a + b
        if tok not in first_id:
            raise DataError(f"merge {a!r} + {b!r} makes a token missing from the vocabulary")
        results.append(tok)
    singles = sorted((bytes([b]) for b in range(256)), key=first_id.__getitem__)
    ordered = singles + [t for t in dict.fromkeys(results) if len(t) > 1]
    merged_ids = [first_id[t] for t in ordered[256:]]
    if all(x < y for x, y in zip(merged_ids, merged_ids[1:])):
        return {t: first_id[t] for t in ordered}, None  # ids already follow merge order
    return {t: r for r, t in enumerate(ordered)}, [first_id[t] for t in ordered]


# --------------------------------------------------------------------------- built-in tokenizers


def byte_tokenizer() -> Tokenizer:
    """256 byte ids (id = byte value) + `<|endoftext|>` = 256."""
    vocab = {b: bytes([b]) for b in range(256)}
    vocab[256] = EOT.encode()
    tok = Tokenizer(vocab, [], [EOT])
    tok.spec = "bytes"
    return tok


def gpt2_files() -> tuple[Path, Path] | None:
    """GPT-2's vocab.json and merges from the cs336 corpus in the data root, when it is there."""
    folder = data_root() / "cs336"
    v, m = folder / "gpt2_vocab.json", folder / "gpt2_merges.txt"
    return (v, m) if v.is_file() and m.is_file() else None


@functools.lru_cache(maxsize=4)
def _gpt2() -> Tokenizer:
    files = gpt2_files()
    if files is not None:
        tok = Tokenizer.from_files(*files, special_tokens=[EOT])
    else:
        try:
            enc = tiktoken.get_encoding("gpt2")  # tiktoken's cache (TIKTOKEN_CACHE_DIR) or the network
        except Exception as e:
            raise DataError(
                f"{data_root() / 'cs336'}: no GPT-2 vocabulary (gpt2_vocab.json + gpt2_merges.txt) and tiktoken "
                f"could not fetch it ({type(e).__name__}: {e}); run `python -m jaxlm.data download cs336`, "
                "or fill TIKTOKEN_CACHE_DIR on a machine with network access"
            ) from None
        ranks = enc._mergeable_ranks  # bytes -> rank, rank == GPT-2 id
        vocab = {r: t for t, r in ranks.items()}
        merges = _merges_from_ranks(ranks)
        vocab[enc.eot_token] = EOT.encode()
        tok = Tokenizer(vocab, merges, [EOT])
    tok.spec = "gpt2"
    return tok


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Recover the merge list from tiktoken ranks: each token splits into its lowest-rank-built halves."""
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        best = min(
            ((max(ranks[tok[:k]], ranks[tok[k:]]), k) for k in range(1, len(tok))
             if tok[:k] in ranks and tok[k:] in ranks and max(ranks[tok[:k]], ranks[tok[k:]]) < rank),
            default=None,
        )
        if best is None:
            raise DataError(f"tiktoken rank table has an unreachable token {tok!r}")
        merges.append((tok[: best[1]], tok[best[1] :]))
    return merges


def trained_bpe_size(spec) -> int | None:
    """N of a "bpe:N" spec (a BPE of N entries that `jaxlm.data.prepare` trains on the training text; None for
    other specs); a malformed N is a DataError naming it."""
    spec = str(spec)
    if not spec.startswith("bpe:"):
        return None
    n = spec[len("bpe:"):]
    if not n.isdigit() or int(n) <= 257:
        raise DataError(f"tokenizer {spec!r}: expected bpe:N with N > 257 "
                        "(256 bytes, <|endoftext|> and at least one merge)")
    return int(n)


def load_tokenizer(spec: str | os.PathLike):
    """`"bytes"`, `"gpt2"`, a directory with vocab.json + merges.txt (+ special_tokens.json), or one with a
    Hugging Face tokenizer.json (`HFTokenizer`, the hf extra)."""
    spec = str(spec)
    if spec == "bytes":
        return byte_tokenizer()
    if spec == "gpt2":
        return _gpt2()
    d = Path(spec)
    if not d.is_dir():
        raise DataError(f"{spec}: unknown tokenizer; use 'bytes', 'gpt2' or a directory with vocab.json + merges.txt "
                        "or tokenizer.json")
    if is_hf_tokenizer(d):
        return HFTokenizer.from_dir(d)
    vocab_path, merges_path = d / "vocab.json", d / "merges.txt"
    for p in (vocab_path, merges_path):
        if not p.is_file():
            raise DataError(f"{p}: file not found (a tokenizer directory needs vocab.json and merges.txt)")
    vocab, merges = load_vocab_merges(vocab_path, merges_path)
    specials_path = d / "special_tokens.json"
    if specials_path.is_file():
        try:
            specials = json.loads(specials_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{specials_path}: not valid JSON ({e})") from None
        if not (isinstance(specials, list) and all(isinstance(s, str) for s in specials)):
            raise DataError(f"{specials_path}: expected a JSON list of strings")
    else:
        specials = [EOT] if EOT.encode() in vocab.values() else []
    tok = Tokenizer(vocab, merges, specials)
    tok.spec = str(d)
    return tok
