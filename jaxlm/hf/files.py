"""Reading a Hugging Face checkpoint directory: config.json, the shard index, safetensors headers and tensors.

Every malformed file (not JSON, not an object, a shard the index names but the directory lacks, a header that
overruns its file, a symbolic-link loop) is one CheckpointError naming the file and what is wrong with it.

safetensors' layout is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}}``, then the tensors' bytes. Headers are read here and each tensor with plain
reads, rather than through the safetensors library's memory map of the whole file: a 13 GB file mapped at once
needs 13 GB of address space (refused under ``ulimit -v``) before anything can be checked, while the headers
alone say what an import will need, and a tensor read on its own holds only itself.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jaxlm.core.errors import CheckpointError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 * 2**20  # the format's own bound on the JSON header
# safetensors dtype -> bytes per element; FLOATS: the ones a float checkpoint's weights come in
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
            "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
FLOATS = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


@dataclass(frozen=True)
class Tensor:
    """Where one tensor lies: its file, name, safetensors dtype, shape and byte range in the file."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # first byte in the file
    nbytes: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def read_object(path: Path) -> dict:
    """A JSON file holding an object; one CheckpointError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text, so not the JSON file it should be") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: a JSON {type(data).__name__} where an object ({{...}}) is expected")
    return data


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: the index's shards, or model.safetensors, or every
    *.safetensors; a CheckpointError naming the index or the directory when they cannot be found."""
    index = directory / INDEX
    if os.path.lexists(index):
        weight_map = read_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or \
                not all(isinstance(v, str) and v and Path(v).name == v for v in weight_map.values()):
            raise CheckpointError(f"{index}: no weight_map of tensor names to shard files in this directory")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not os.path.lexists(directory / s)]
        if missing:
            raise CheckpointError(f"{index}: names shard {missing[0]}, which {directory} does not hold "
                                  f"({len(missing)} of {len(shards)} shards missing); download the checkpoint again")
        return [directory / s for s in shards]
    if os.path.lexists(directory / SINGLE):
        return [directory / SINGLE]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no {SINGLE}, {INDEX} or *.safetensors (only safetensors checkpoints "
                              "import; convert a pytorch_model.bin with transformers first)")
    return files


def _header_bytes(path: Path) -> tuple[bytes, int]:
    """(the JSON header, the file's size)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            if n is None or n > min(size - 8, MAX_HEADER):
                what = "empty" if size == 0 else f"{size:,} bytes" if n is None else \
                    f"its header claims {n:,} bytes, the file has {size:,}"
                raise CheckpointError(f"{path}: not a complete safetensors file ({what}: truncated, or another "
                                      "format); download it again")
            return f.read(n), size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None


def header(path: Path) -> dict[str, Tensor]:
    """The tensors one safetensors file declares, each checked to lie inside the file."""
    text, size = _header_bytes(path)
    try:
        entries = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: its safetensors header is not valid JSON ({e}); download it again") from None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: its safetensors header is not a JSON object; download it again")
    data_start, out = 8 + len(text), {}
    for name, e in entries.items():
        if name == "__metadata__":
            continue
        ok = isinstance(e, dict) and e.get("dtype") in ITEMSIZE and isinstance(e.get("shape"), list) and \
            all(isinstance(d, int) and d >= 0 for d in e["shape"]) and isinstance(e.get("data_offsets"), list) and \
            len(e["data_offsets"]) == 2 and all(isinstance(o, int) for o in e["data_offsets"])
        if not ok:
            raise CheckpointError(f"{path}: tensor {name}: its header entry {str(e)[:120]} is not a safetensors one "
                                  "(dtype, shape, data_offsets)")
        begin, end = e["data_offsets"]
        t = Tensor(path, name, e["dtype"], tuple(e["shape"]), data_start + begin, end - begin)
        if not 0 <= begin <= end or t.nbytes != t.size * ITEMSIZE[t.dtype]:
            raise CheckpointError(f"{path}: tensor {name}: data_offsets {e['data_offsets']} do not hold a "
                                  f"{t.dtype} tensor of shape {t.shape}")
        if data_start + end > size:
            raise CheckpointError(f"{path}: truncated: tensor {name} ends at byte {data_start + end:,}, the file has "
                                  f"{size:,}; download it again")
        out[name] = t
    return out


def tensors(directory: Path) -> dict[str, Tensor]:
    """Every tensor of the checkpoint by name (headers only: nothing is loaded)."""
    out: dict[str, Tensor] = {}
    for path in weight_files(directory):
        for name, t in header(path).items():
            if name in out:
                raise CheckpointError(f"{path}: tensor {name} is also in {out[name].file}; which one to load is "
                                      "ambiguous")
            out[name] = t
    return out


def read(t: Tensor) -> np.ndarray:
    """The tensor's values (a float dtype of FLOATS), read on their own."""
    import jax.numpy as jnp  # numpy's bfloat16 (ml_dtypes), as JAX registers it

    out = np.empty(t.shape, jnp.dtype(FLOATS[t.dtype]))  # safetensors is little-endian, as every host JAX runs on
    try:
        with open(t.file, "rb") as f:
            f.seek(t.start)
            got = f.readinto(memoryview(out.reshape(-1).view(np.uint8)))
    except OSError as e:
        raise CheckpointError(f"{t.file}: cannot be read ({e.strerror or e})") from None
    if got != t.nbytes:
        raise CheckpointError(f"{t.file}: ended inside tensor {t.name} (changed while it was imported?)")
    return out
