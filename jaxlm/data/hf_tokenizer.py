"""A Hugging Face `tokenizer.json` behind the interface of jaxlm's `Tokenizer` (the `hf` extra).

The file runs through the `tokenizers` library, the ecosystem's implementation of these files (byte-level
BPE with its pre-tokeniser, SentencePiece-style BPE, added and special tokens), so ids equal what
`transformers` gives for the same text. A directory holding `tokenizer.json` is a tokenizer wherever
jaxlm takes one (``data.tokenizer``, a run's ``tokenizer/``, ``python -m jaxlm.generate --tokenizer``).

Special ids come from the model's `generation_config.json` beside it: its ``eos_token_id`` (one id or a
list) ends a generation and a document; a prompt starts with BOS only where the tokenizer's own
post-processor adds one (as ``tokenizer(text)`` does in transformers). Training text is encoded without
that post-processing: documents are cut into chunks before they are encoded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Iterator

from jaxlm.core.errors import DataError
from jaxlm.core.extras import require
from jaxlm.data.bpe import str_to_token

TOKENIZER_JSON = "tokenizer.json"
GENERATION_CONFIG = "generation_config.json"  # bos_token_id, eos_token_id (transformers' GenerationConfig)
# transformers' own files beside tokenizer.json (bos/eos tokens, chat template): carried along with it, so that
# AutoTokenizer reads the same tokenizer from a prepared data directory, a run and its export
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")


def is_hf_tokenizer(directory) -> bool:
    return (Path(directory) / TOKENIZER_JSON).is_file()


def _ids(value) -> list[int]:
    """generation_config's eos_token_id: unset, one id or a list -> a list."""
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]


class HFTokenizer:
    """`encode`, `decode`, `decode_bytes`, `vocab_size`, `eot_id`, `bos_id`, `stop_ids`, as `Tokenizer` has."""

    def __init__(self, text: str, generation: dict, spec: str | None = None):
        tokenizers = require("tokenizers")
        try:
            self._tok = tokenizers.Tokenizer.from_str(text)
        except Exception as e:  # the Rust parser raises its own exception type
            raise DataError(f"{spec or TOKENIZER_JSON}: not a tokenizer.json the tokenizers library reads ({e})") \
                from None
        self._text, self.generation, self.spec = text, dict(generation), spec
        added = json.loads(text).get("added_tokens") or []
        self.special_tokens = [t["content"] for t in added if t.get("special")]
        self._added = {t["id"]: t["content"].encode() for t in added}
        decoder = json.loads(text).get("decoder") or {}
        kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
        self._byte_level = "ByteLevel" in kinds
        self.stop_ids = _ids(self.generation.get("eos_token_id"))
        with_specials = self._tok.encode("a", add_special_tokens=True).ids
        plain = self._tok.encode("a", add_special_tokens=False).ids
        self.bos_id = with_specials[0] if with_specials[:len(plain)] != plain else None  # the post-processor's BOS
        self.files = (TOKENIZER_JSON, GENERATION_CONFIG, *TOKENIZER_EXTRAS)  # copied with it where present
        self._size = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

    @classmethod
    def from_dir(cls, directory) -> "HFTokenizer":
        d = Path(directory)
        generation = {}
        if (d / GENERATION_CONFIG).is_file():
            try:
                generation = json.loads((d / GENERATION_CONFIG).read_text(encoding="utf-8"))
            except ValueError as e:
                raise DataError(f"{d / GENERATION_CONFIG}: not valid JSON ({e})") from None
        return cls((d / TOKENIZER_JSON).read_text(encoding="utf-8"), generation, str(d))

    def __getstate__(self):
        return {"text": self._text, "generation": self.generation, "spec": self.spec}

    def __setstate__(self, state):
        self.__init__(state["text"], state["generation"], state["spec"])

    def __repr__(self):
        return f"HFTokenizer(spec={self.spec!r}, vocab_size={self.vocab_size}, stop_ids={self.stop_ids})"

    def save(self, directory) -> None:
        """tokenizer.json and generation_config.json into `directory` (which exists)."""
        (Path(directory) / TOKENIZER_JSON).write_text(self._text, encoding="utf-8")
        (Path(directory) / GENERATION_CONFIG).write_text(json.dumps(self.generation, indent=2) + "\n")

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (the embedding table needs at least this many rows)."""
        return self._size

    @property
    def eot_id(self) -> int | None:
        """The first end-of-sequence id: the one appended after each document of training text."""
        return self.stop_ids[0] if self.stop_ids else None

    def digest(self) -> str:
        """SHA-256 of the tokenizer as the library serialises it: equal digests encode identically."""
        return hashlib.sha256(self._tok.to_str().encode()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special tokens written in it included, without BOS/EOS post-processing."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Ids of the concatenated pieces: the file's lines encoded together."""
        yield from self.encode("".join(iterable))

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of the tokens (a byte-level tokenizer's exactly, so a stream can hold back an incomplete
        UTF-8 character; other kinds: the decoded text's)."""
        ids = [int(i) for i in ids]
        if not self._byte_level:
            return self.decode(ids).encode()
        out = []
        for i in ids:
            token = self._tok.id_to_token(i)
            if token is None:
                raise ValueError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
            out.append(self._added[i] if i in self._added else str_to_token(token))
        return b"".join(out)
