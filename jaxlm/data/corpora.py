"""Corpora by name: a small registry, the data root they live in, and their download.

The data root is `$JAXLM_DATA`, else `~/.cache/jaxlm/data`. Corpus NAME keeps its
files in ROOT/NAME/ (`tinyshakespeare/input.txt`, `wikitext-2/valid.txt`, ...), so
any folder laid out that way can serve as the root. A config names a corpus
(`data.source = ["tinyshakespeare"]`) or one of its files (`"wikitext-2/test.txt"`) and
`resolve_sources` turns the name into the corpus's training files (or that file); a
missing corpus fails in one line giving the download command.

`python -m jaxlm.data download NAME` fetches a corpus (urllib only): each file goes to
`FILE.part` (resumed with an HTTP Range request when a part exists), its size and
SHA-256 are checked where the registry knows them, and it is renamed into place;
archives are unpacked the same way. Without network access it fails within
`timeout` seconds, naming the URL to fetch by hand.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from jaxlm.core.errors import CorpusMissing, DataError
from jaxlm.core.files import atomic_path, writable_dir_problem
from jaxlm.data.chunks import progress_bar


@dataclass(frozen=True)
class Remote:
    """One file to fetch into the corpus folder, with the size and SHA-256 it must have (None: unknown)."""

    url: str
    name: str
    size: int | None = None
    sha256: str | None = None
    unpack: str | None = None  # "gunzip" | "unzip": an archive, unpacked into the corpus folder and removed


@dataclass(frozen=True)
class Corpus:
    name: str
    about: str
    train: tuple[str, ...]  # what `data.source = [NAME]` stands for: files in ROOT/NAME/
    files: tuple[str, ...]  # every file the download leaves in ROOT/NAME/
    remotes: tuple[Remote, ...]


_HF = "https://huggingface.co/datasets"
_CS336 = "https://raw.githubusercontent.com/stanford-cs336/assignment1-basics/main/tests/fixtures"
_WT2 = "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2"
# Sizes and digests are those of the canonical copies of the small corpora; for the large ones the
# registry has none yet, so their downloads are not checked.
_CS336_FILES = {
    "address.txt": (1468, "fc1f209025d3181137b8953cfeb559ab186782d48b93182eac2b6401816c1df4"),
    "corpus.en": (133027, "617f603a49eeb8a20de9d922d11a5d70e1d362327b9e91718bea2cdcdf9816ff"),
    "german.txt": (594, "372a3b9d896f2774e83721ea5d9aedc77a65ea31d7dfd77c4dbc6ee5eac50c28"),
    "gpt2_merges.txt": (456304, "ac33235097fe06d4a8fff0feac994644809e6eb6ab70669e1e9fd40ae032428e"),
    "gpt2_vocab.json": (1042301, "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "special_token_double_newlines_non_whitespace.txt":
        (23, "385b1a48679d11ec498dbda931e5d6bb035d0db87998730197bf1e11ab97d297"),
    "special_token_trailing_newlines.txt": (15, "c7fac215bf4c84da8e1bbad6ff1fe9c07754f961479aa25c26b3460a2077da82"),
    "tinystories_sample.txt": (3794, "defaedb58bf28079f3e29c6142cb7f3568d331a577e0911c5d7925c465c50c43"),
    "train-bpe-reference-merges.txt": (1271, "f74582742501ca5edd5be2b66adb83d7ae2b8d6363fd276771792e70de1428ed"),
    "train-bpe-reference-vocab.json": (7610, "e28bfb2a4fa95ec786faf462cb0d504bc15773360f4891bdf262be171ab86c18"),
}

CORPORA: dict[str, Corpus] = {c.name: c for c in (
    Corpus("tinyshakespeare", "Shakespeare's plays as one 1.1 MB text (char-rnn); public domain",
           ("input.txt",), ("input.txt",),
           (Remote("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
                   "input.txt", 1115394, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),)),
    Corpus("wikitext-2", "WikiText-2 validation and test splits, word-level with <unk>, 2.4 MB; CC BY-SA 3.0",
           ("valid.txt",), ("valid.txt", "test.txt"),
           (Remote(f"{_WT2}/valid.txt", "valid.txt", 1121681,
                   "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
            Remote(f"{_WT2}/test.txt", "test.txt", 1256449,
                   "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"))),
    Corpus("cs336", "the CS336 assignment-1 test fixtures (GPT-2 vocabulary, BPE references, samples), 1.6 MB; MIT",
           ("corpus.en",), tuple(_CS336_FILES),
           tuple(Remote(f"{_CS336}/{n}", n, size, sha) for n, (size, sha) in _CS336_FILES.items())),
    Corpus("tinystories", "TinyStories V2 (GPT-4 stories), 2.2 GB train + 22 MB valid; CDLA-Sharing-1.0",
           ("TinyStoriesV2-GPT4-train.txt",), ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt"),
           tuple(Remote(f"{_HF}/roneneldan/TinyStories/resolve/main/{n}", n)
                 for n in ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt"))),
    Corpus("openwebtext", "the CS336 OpenWebText sample, 11 GB train + 290 MB valid (gzipped download)",
           ("owt_train.txt",), ("owt_train.txt", "owt_valid.txt"),
           tuple(Remote(f"{_HF}/stanford-cs336/owt-sample/resolve/main/{n}.gz", f"{n}.gz", unpack="gunzip")
                 for n in ("owt_train.txt", "owt_valid.txt"))),
    Corpus("wikitext103", "WikiText-103 raw (Salesforce release), 540 MB train; CC BY-SA 3.0",
           ("wiki.train.raw",), ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"),
           (Remote("https://wikitext.smerity.com/wikitext-103-raw-v1.zip", "wikitext-103-raw-v1.zip",
                   unpack="unzip"),)),
)}


def data_root() -> Path:
    """`$JAXLM_DATA`, else ~/.cache/jaxlm/data."""
    return Path(os.environ.get("JAXLM_DATA") or Path.home() / ".cache" / "jaxlm" / "data").expanduser()


def corpus_files(name: str, root: str | os.PathLike | None = None, which: str = "train") -> list[Path]:
    """The files of corpus `name` under the data root; DataError with the download command when absent."""
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    corpus, folder = CORPORA[name], Path(root or data_root()) / name
    paths = [folder / f for f in (corpus.train if which == "train" else corpus.files)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise CorpusMissing(f"{missing[0]}: corpus {name!r} not found; run `python -m jaxlm.data download {name}` "
                            "(or point JAXLM_DATA at a folder that holds it)", name)
    return paths


def corpus_file(source: str, root: str | os.PathLike | None = None) -> Path | None:
    """ROOT/NAME/FILE for a source "NAME/FILE" naming one of corpus NAME's files (None for any other source);
    DataError with the download command when it is missing."""
    name, _, file = source.partition("/")
    if name not in CORPORA or file not in CORPORA[name].files:
        return None
    path = Path(root or data_root()) / name / file
    if not path.is_file():
        raise CorpusMissing(f"{path}: corpus {name!r} not found; run `python -m jaxlm.data download {name}` "
                            "(or point JAXLM_DATA at a folder that holds it)", name)
    return path


def resolve_sources(sources: list[str] | tuple[str, ...]) -> list[str]:
    """Corpus names become their training files and "NAME/FILE" that file of the corpus, both in the data
    root; file paths (and "pydoc") pass through."""
    out: list[str] = []
    for s in map(str, sources):
        one = None if s in CORPORA or Path(s).is_file() else corpus_file(s)
        out += [str(p) for p in corpus_files(s)] if s in CORPORA else [str(one or s)]
    return out


def _check(path: Path, remote: Remote) -> None:
    """Size and SHA-256 against the registry; a mismatching file is deleted."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    got = digest.hexdigest()
    for what, want, have in (("size", remote.size, size), ("sha256", remote.sha256, got)):
        if want is not None and want != have:
            path.unlink()
            raise DataError(f"{remote.url}: {what} {have}, expected {want}; the download is corrupt or the file "
                            "changed upstream (deleted; rerun to retry)")


def fetch(remote: Remote, dest: Path, timeout: float = 10.0, progress: bool = True) -> Path:
    """Download `remote` to `dest` via `dest.part`, resuming a partial download; checked before the rename."""
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(remote.url, headers={"User-Agent": "jaxlm-data"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"{dest}: cannot download {remote.url} ({reason}); without the network, copy the file there "
                        f"from a machine that has it (`curl -L -o {dest.name} {remote.url}`) and rerun, or point "
                        f"JAXLM_DATA at a folder that holds {dest.parent.name}/; the README's quickstart needs no "
                        "download") from None
    with response:
        resumed = have and response.status == 206
        total = int(response.headers.get("Content-Length", 0) or 0) + (have if resumed else 0)
        bar = progress_bar(total or None, dest.name, progress, unit="B", initial=have if resumed else 0)
        try:
            with open(part, "ab" if resumed else "wb") as f:
                while block := response.read(1 << 20):
                    f.write(block)
                    bar.update(len(block))
        except (urllib.error.URLError, OSError) as e:
            raise DataError(f"{dest}: download of {remote.url} interrupted ({e}); rerun to resume") from None
        finally:
            bar.close()
    _check(part, remote)
    os.replace(part, dest)
    return dest


def _unpack(archive: Path, how: str) -> None:
    """Unpack into the archive's folder (flattened), then delete the archive."""
    if how == "gunzip":
        with atomic_path(archive.with_suffix("")) as tmp, gzip.open(archive, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    else:
        with zipfile.ZipFile(archive) as z:
            for info in (i for i in z.infolist() if not i.is_dir()):
                with (atomic_path(archive.parent / Path(info.filename).name) as tmp, z.open(info) as src,
                      open(tmp, "wb") as dst):
                    shutil.copyfileobj(src, dst, 1 << 22)
    archive.unlink()


def download(name: str, root: str | os.PathLike | None = None, timeout: float = 10.0,
             progress: bool = True) -> list[Path]:
    """Fetch corpus `name` into ROOT/NAME/ (nothing to do when its files are there); returns its files."""
    if name not in CORPORA:
        raise DataError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    corpus, folder = CORPORA[name], Path(root or data_root()) / name
    if all((folder / f).is_file() for f in corpus.files):
        return [folder / f for f in corpus.files]
    problem = writable_dir_problem(folder)
    if problem:  # before any download
        raise DataError(f"{folder}: cannot hold the download: {problem}; choose another --root (or $JAXLM_DATA)")
    folder.mkdir(parents=True, exist_ok=True)
    for remote in corpus.remotes:
        unpacked = remote.name.removesuffix(".gz") if remote.unpack == "gunzip" else remote.name
        if remote.unpack != "unzip" and (folder / unpacked).is_file():
            continue
        path = fetch(remote, folder / remote.name, timeout=timeout, progress=progress)
        if remote.unpack:
            _unpack(path, remote.unpack)
    return corpus_files(name, root, which="all")
