"""jaxlm's own byte-level BPE (`jaxlm.data.tokenizer.Tokenizer`) written as a Hugging Face tokenizer.json.

Both are GPT-2's scheme: the GPT-2 pre-tokeniser pattern, bytes mapped to printable characters, merges
applied by rank. So the `tokenizers` library's BPE model over the same vocabulary (in GPT-2's character
form) and merges, with its ByteLevel pre-tokeniser and decoder, gives the same ids; the special tokens
keep their ids as added tokens.
"""

from __future__ import annotations

from jaxlm.core.extras import require
from jaxlm.data.bpe import token_to_str


def to_tokenizer_json(tok) -> str:
    """tokenizer.json text encoding as `tok` does."""
    tk = require("tokenizers")
    vocab = {token_to_str(b): i for i, b in sorted(tok.vocab.items())}
    merges = [(token_to_str(a), token_to_str(b)) for a, b in tok.merges]
    out = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges))
    out.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    out.decoder = tk.decoders.ByteLevel()
    out.add_special_tokens([tk.AddedToken(s, special=True, normalized=False) for s in tok.special_tokens])
    return out.to_str()
