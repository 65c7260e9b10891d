"""Fetch the public corpora of the CS336 curriculum (urllib only; atomic and resumable).

| name         | files written to --out                                   | from |
|--------------|----------------------------------------------------------|------|
| tinystories  | TinyStoriesV2-GPT4-train.txt, TinyStoriesV2-GPT4-valid.txt | huggingface.co/datasets/roneneldan/TinyStories |
| openwebtext  | owt_train.txt, owt_valid.txt (gunzipped)                  | huggingface.co/datasets/stanford-cs336/owt-sample |
| wikitext103  | wiki.train.raw, wiki.valid.raw, wiki.test.raw (unzipped)  | wikitext.smerity.com (the Salesforce release) |

A download goes to `NAME.part` (resumed with an HTTP Range request when the part
exists) and is renamed when complete; archives are unpacked the same way. Without
network access it fails within `timeout` seconds, naming the URL to fetch by hand.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from jaxlm.errors import DataError
from jaxlm.files import atomic_path
from jaxlm.data.bpe import _bar

_HF = "https://huggingface.co/datasets"
# name -> list of (url, file name to store, how to unpack: None | "gunzip" | "unzip")
DATASETS: dict[str, list[tuple[str, str, str | None]]] = {
    "tinystories": [
        (f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-train.txt", None),
        (f"{_HF}/roneneldan/TinyStories/resolve/main/TinyStoriesV2-GPT4-valid.txt", "TinyStoriesV2-GPT4-valid.txt", None),
    ],
    "openwebtext": [
        (f"{_HF}/stanford-cs336/owt-sample/resolve/main/owt_train.txt.gz", "owt_train.txt.gz", "gunzip"),
        (f"{_HF}/stanford-cs336/owt-sample/resolve/main/owt_valid.txt.gz", "owt_valid.txt.gz", "gunzip"),
    ],
    "wikitext103": [
        ("https://wikitext.smerity.com/wikitext-103-raw-v1.zip", "wikitext-103-raw-v1.zip", "unzip"),
    ],
}


def fetch(url: str, dest: Path, timeout: float = 10.0, progress: bool = True) -> Path:
    """Download `url` to `dest` via `dest.part`, resuming a previous partial download."""
    if dest.is_file():
        return dest
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "jaxlm-data"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"{dest}: cannot download {url} ({reason}); fetch it by hand, e.g. `curl -L -o {dest} {url}`, then rerun") from None
    with response:
        resumed = have and response.status == 206
        total = int(response.headers.get("Content-Length", 0) or 0) + (have if resumed else 0)
        bar = _bar(total or None, dest.name, progress, unit="B", initial=have if resumed else 0)
        try:
            with open(part, "ab" if resumed else "wb") as f:
                while block := response.read(1 << 20):
                    f.write(block)
                    bar.update(len(block))
        except (urllib.error.URLError, OSError) as e:
            raise DataError(f"{dest}: download of {url} interrupted ({e}); rerun to resume") from None
        finally:
            bar.close()
    os.replace(part, dest)
    return dest


def _unpack(archive: Path, how: str) -> list[Path]:
    if how == "gunzip":
        out = archive.with_suffix("")
        if out.is_file():
            return [out]
        with atomic_path(out) as tmp, gzip.open(archive, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        return [out]
    outs = []
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            out = archive.parent / Path(info.filename).name
            with atomic_path(out) as tmp, z.open(info) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
            outs.append(out)
    return outs


def download(name: str, out: str | os.PathLike, timeout: float = 10.0, progress: bool = True) -> list[Path]:
    """Download and unpack dataset `name` (a key of DATASETS) into `out`; returns the text files."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for url, filename, how in DATASETS[name]:
        path = fetch(url, out / filename, timeout=timeout, progress=progress)
        if how is None:
            files.append(path)
        else:
            files += _unpack(path, how)
    if progress:
        print("\n".join(str(f) for f in files), file=sys.stderr)
    return files
