"""The four data entry points training uses, in one place.

They come from `jaxlm.data.loader` / `jaxlm.data.prepare` (owned by the data
work). Until those modules exist this file carries small stand-ins with the same
names and signatures (numpy memmap windows, the batch of step s a pure function
of (seed, s)), so training runs and tests pass either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

try:  # the real ones
    from jaxlm.data.loader import eval_batches, train_batches  # noqa: F401
    from jaxlm.data.prepare import ensure_prepared, load_tokenizer_from_meta  # noqa: F401

    INTERIM = False
except ImportError:  # stand-ins until jaxlm.data.loader / prepare land
    INTERIM = True

    def _read_source(src: str) -> list[str]:
        if src == "pydoc":
            import pydoc_data.topics

            return [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
        p = Path(src)
        if not p.is_file():
            raise FileNotFoundError(f"data.source: {src} not found (relative paths resolve against {Path.cwd()})")
        return [p.read_text(encoding="utf-8")]

    def ensure_prepared(data_cfg) -> Path:
        d = Path(data_cfg.dir)
        if (d / "train.bin").is_file() and (d / "val.bin").is_file() and (d / "meta.json").is_file():
            return d
        from jaxlm.data.tokenizer import load_tokenizer

        tok = load_tokenizer(data_cfg.tokenizer)
        ids: list[int] = []
        for src in data_cfg.source:
            for doc in _read_source(src):
                ids.extend(tok.encode(doc))
                if tok.eot_id is not None and len(data_cfg.source) + (src == "pydoc") > 1:
                    ids.append(tok.eot_id)
        dtype = np.uint16 if tok.vocab_size < 65536 else np.uint32
        arr = np.asarray(ids, dtype)
        n_val = max(int(len(arr) * data_cfg.val_fraction), 1)
        d.mkdir(parents=True, exist_ok=True)
        arr[:-n_val].tofile(d / "train.bin")
        arr[-n_val:].tofile(d / "val.bin")
        meta = {"dtype": np.dtype(dtype).name, "vocab_size": tok.vocab_size, "tokenizer": tok.spec, "eot_id": tok.eot_id}
        (d / "meta.json").write_text(json.dumps(meta, indent=1))
        return d

    def load_tokenizer_from_meta(data_dir):
        from jaxlm.data.tokenizer import load_tokenizer

        return load_tokenizer(json.loads((Path(data_dir) / "meta.json").read_text())["tokenizer"])

    def _tokens(data_dir, split):
        meta = json.loads((Path(data_dir) / "meta.json").read_text())
        return np.memmap(Path(data_dir) / f"{split}.bin", dtype=meta["dtype"], mode="r")

    def train_batches(data_dir, batch_size, context_length, seed, start_step=0, process_index=0, process_count=1, num_workers=0, prefetch=2):
        data = _tokens(data_dir, "train")
        local = batch_size // process_count
        step = start_step
        while True:
            rng = np.random.default_rng([seed, step])
            starts = rng.integers(0, len(data) - context_length, size=batch_size)[process_index * local : (process_index + 1) * local]
            win = np.stack([np.asarray(data[s : s + context_length + 1], np.int32) for s in starts])
            yield win[:, :-1], win[:, 1:]
            step += 1

    def eval_batches(data_dir, split, batch_size, context_length, max_batches=None):
        data = _tokens(data_dir, split)
        n = (len(data) - 1) // context_length
        count = 0
        for b in range(0, n - batch_size + 1, batch_size):
            if max_batches is not None and count >= max_batches:
                return
            win = np.stack([np.asarray(data[(b + i) * context_length : (b + i + 1) * context_length + 1], np.int32) for i in range(batch_size)])
            yield win[:, :-1], win[:, 1:]
            count += 1


def read_meta(data_dir) -> dict:
    return json.loads((Path(data_dir) / "meta.json").read_text())
