"""Tokenizer and data pipeline (docs/spec.md#data, docs/spec.md#tokenizer).

One module per concept; `bpe` and `tokenizer` import neither jax nor grain:

- `jaxlm.data.bpe`: `train_bpe`, `save_vocab_merges`, `load_vocab_merges`
- `jaxlm.data.chunks`: text files cut into ranges for parallel workers (`file_chunks`, `read_chunk`)
- `jaxlm.data.tokenizer`: `Tokenizer`, `load_tokenizer("bytes" | "gpt2" | DIR)`
- `jaxlm.data.prepare`: `prepare`, `ensure_prepared(DataConfig)`, `load_tokenizer_from_meta`, `read_meta`
- `jaxlm.data.loader` (numpy + grain): `train_batches`, `eval_batches`, `get_batch`
- `jaxlm.data.corpora`: corpora by name (`CORPORA`), the data root (`$JAXLM_DATA`), `download(NAME)`
- `python -m jaxlm.data {prepare,train-bpe,list,download,bench}`; see docs/data.md
"""

from jaxlm.core.errors import DataError

__all__ = ["DataError"]
