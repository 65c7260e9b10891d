"""The largest token id of a token file, found by a memory-mapped scan and recorded with the file's stamp
(checked against the model's vocabulary before training, without reading the data twice)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_SCAN_CHUNK = 1 << 26  # tokens per slice of the max-id scan


def scan_max(path: Path, dtype) -> int:
    """The largest id in a token file (-1 when empty), read memory-mapped in slices."""
    if path.stat().st_size == 0:
        return -1
    ids = np.memmap(path, dtype=dtype, mode="r")
    return max(int(ids[lo : lo + _SCAN_CHUNK].max()) for lo in range(0, len(ids), _SCAN_CHUNK))


def stamped_max_ids(values: dict[str, int], data_dir: Path) -> dict:
    """meta.json's record of each split's largest id, stamped with the file's size and mtime."""
    stamps = {}
    for split in values:
        st = (data_dir / f"{split}.bin").stat()
        stamps[split] = [st.st_size, st.st_mtime_ns]
    return {"max_token_id": values, "max_token_id_stamps": stamps}
