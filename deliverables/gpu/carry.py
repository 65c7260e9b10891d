"""`python -m deliverables.gpu.carry download|check`: the wheels and the corpus the offline GPU run carries in `.whl/`
(docs/gpu.md). The functions use the standard library and `packaging` only: the offline run calls `install` before
jaxlm's dependencies are there."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MANIFEST, IMAGE = HERE / "wheels.txt", HERE / "image.txt"
FOLDER = REPO / ".whl"
CORPUS = Path("tinyshakespeare/input.txt")  # the shakespeare step's, under the data root
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
PYTHON = (3, 12)  # the offline machine's Python (3.12.3)
TARGET_PIP = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              *(a for p in PLATFORMS for a in ("--platform", p)))  # pip's options for that interpreter and platform
# The offline machine's interpreter, for evaluating the wheels' environment markers.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


@dataclass(frozen=True)
class Wheel:
    requirement: str  # "name==version"
    file: str
    size: int
    sha256: str
    requires: tuple[str, ...]  # normalised requirements (see `normalise`), markers already evaluated

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.split("==")[0])

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1]


def _entries(path: Path) -> list[str]:
    """The lines of a list file that are neither blank nor comments."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def read_manifest(path: Path = MANIFEST) -> list[Wheel]:
    return [Wheel(req, file, int(size), sha, tuple(filter(None, ";".join(rest).split(";"))))
            for req, file, size, sha, *rest in map(str.split, _entries(path))]


def read_image(path: Path = IMAGE) -> dict[str, str | None]:
    """Package name -> version (None where the image's notes give none)."""
    pairs = (e.partition("==") for e in _entries(path))
    return {canonicalize_name(name): version or None for name, _, version in pairs}


def dependencies(root: Path = REPO) -> list[str]:
    """pyproject.toml's [project] dependencies."""
    return tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]


def normalise(text: str) -> str | None:
    """A requirement as wheels.txt records it ("name[extras]specifier"), or None when its marker leaves it out
    on the offline machine (another platform, an extra)."""
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
        return None
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{canonicalize_name(req.name)}{extras}{req.specifier}"


def _unmet(text: str, available: dict[str, str | None], where: str) -> str | None:
    """Why requirement `text` is not met by `available` (name -> version or None), or None when it is."""
    req = Requirement(text)
    name = canonicalize_name(req.name)
    if name not in available:
        return f"{where} needs {text}: neither on the image (image.txt) nor carried (wheels.txt)"
    version = available[name]
    if version is not None and not req.specifier.contains(version, prereleases=True):
        return f"{where} needs {text}: {name} {version} is there"
    return None


def coverage_problems(wheels: list[Wheel], image: dict[str, str | None], deps: list[str]) -> list[str]:
    """What wheels.txt lacks: a dependency of jaxlm or of a carried wheel that the image does not have."""
    problems, carried = [], {}
    for w in wheels:
        if w.name in carried:
            problems.append(f"{w.name} is listed twice ({carried[w.name]} and {w.version}): one version of each")
        carried[w.name] = w.version
        if w.name in image:
            problems.append(f"{w.requirement}: the image has {w.name} already; carry it only for another version")
    available = {**image, **carried}
    problems += [_unmet(dep, available, "pyproject.toml") for dep in deps if normalise(dep) is not None]
    for w in wheels:
        problems += [_unmet(r, available, w.requirement) for r in w.requires]
    return [p for p in problems if p]


def wheel_requires(path: Path) -> tuple[str, ...]:
    """The normalised Requires-Dist of a wheel's METADATA that apply on the offline machine."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    found = (normalise(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:"))
    return tuple(r for r in found if r)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_problems(wheels: list[Wheel], folder: Path = FOLDER) -> list[str]:
    """Each listed wheel present with its size, checksum and requirements; no other wheel beside them."""
    problems = []
    for w in wheels:
        path = folder / w.file
        if not path.is_file():
            problems.append(f"{path}: missing (python -m deliverables.gpu.carry download)")
        elif path.stat().st_size != w.size or sha256(path) != w.sha256:
            problems.append(f"{path}: not the file wheels.txt lists (size or sha256 differs)")
        elif {normalise(r) for r in w.requires} != set(wheel_requires(path)):
            problems.append(f"{path}: its requirements {sorted(wheel_requires(path))} differ from wheels.txt's")
    extra = sorted({p.name for p in folder.glob("*.whl")} - {w.file for w in wheels})
    if extra:
        problems.append(f"{folder}: wheels not in wheels.txt ({', '.join(extra)}): remove them (one version of each)")
    return problems


def _pip_install(folder: Path, site: Path, *flags: str) -> None:
    files = [str(folder / w.file) for w in read_manifest()]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *flags, *files], check=True)


def resolves(folder: Path = FOLDER) -> str | None:
    """Why pip would not install the listed wheels on the offline machine (CPython 3.12, manylinux x86_64), or None:
    a dry run of the install `install` makes there, for that interpreter and platform, from any machine."""
    try:
        with tempfile.TemporaryDirectory() as site:
            _pip_install(folder, Path(site), "--dry-run", *TARGET_PIP)
    except subprocess.CalledProcessError as e:
        return f"pip would not install .whl/ for CPython 3.12 manylinux x86_64 (exit {e.returncode})"
    return None


def download(folder: Path = FOLDER) -> None:
    """The wheels of wheels.txt into `folder` (pip download for the offline machine's platform), the corpus into
    folder/data."""
    from jaxlm.data.corpora import data_root

    folder.mkdir(parents=True, exist_ok=True)
    for w in read_manifest():
        if (folder / w.file).is_file() and sha256(folder / w.file) == w.sha256:
            continue
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *TARGET_PIP, "-d", str(folder),
                        w.requirement], check=True)
    root = data_root()
    if (root / CORPUS).is_file():
        (folder / "data" / CORPUS).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / CORPUS, folder / "data" / CORPUS)
    else:
        print(f"warning: {root / CORPUS} not found: the shakespeare step will have no corpus there", file=sys.stderr)


def installed(name: str) -> str | None:
    """The version of `name` installed here, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install(folder: Path, site: Path, smoke: bool) -> dict:
    """The offline run's first phase: pip-install the listed wheels (no index, no dependencies) into `site`, put it
    first on sys.path and on PYTHONPATH (for the subprocesses), the repository after it (jaxlm itself, from its
    sources); with `smoke` under another Python than 3.12, a dry run of that install for 3.12 instead."""
    wheels = read_manifest()
    if not any((folder / w.file).is_file() for w in wheels):
        missing = [w.requirement for w in wheels if installed(w.name) is None]
        if missing:
            return {"error": f"no wheels in {folder} and {', '.join(missing)} not installed: run "
                             "python -m deliverables.gpu.carry download where pip reaches PyPI, and carry .whl"}
        return {"skipped": f"no wheels in {folder}: every carried package is installed here already"}
    t0 = time.monotonic()
    try:
        problems = file_problems(wheels, folder)
        if smoke and sys.version_info[:2] != PYTHON:  # wheels this interpreter cannot take
            return {"simulated": "pip install --dry-run for CPython 3.12 manylinux x86_64; packages from this "
                                 "environment", "problem": (problems or [resolves(folder)])[0],
                    "seconds": time.monotonic() - t0}
        if problems:
            return {"error": problems[0]}
        _pip_install(folder, site)
    except subprocess.CalledProcessError as e:  # its command is a page of wheel paths: pip's own output says why
        return {"error": f"pip install into {site} exited {e.returncode} (its output is above)"}
    except OSError as e:
        return {"error": str(e).strip()}
    for path in (str(REPO), str(site)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), str(REPO), os.environ.get("PYTHONPATH"))))
    if (folder / "data" / CORPUS).is_file() and not os.environ.get("JAXLM_DATA"):
        os.environ["JAXLM_DATA"] = str((folder / "data").resolve())  # the shakespeare step's corpus
    return {"seconds": time.monotonic() - t0, "site": str(site), "wheels": [w.requirement for w in wheels],
            "bytes": sum(w.size for w in wheels)}


def main(argv: list[str]) -> int:
    from jaxlm import cli  # the command's alone: the functions above need the standard library and packaging only

    parser = cli.ArgumentParser(command="deliverables.gpu.carry", description=__doc__,
                                formatter_class=cli.HelpFormatter)
    parser.add_argument("what", choices=("download", "check"), help="download the wheels and the corpus into .whl/, "
                        "or check wheels.txt and .whl/")
    if parser.parse_args(argv).what == "download":
        download()
    wheels = read_manifest()
    problems = coverage_problems(wheels, read_image(), dependencies())
    if FOLDER.is_dir():
        problems += file_problems(wheels, FOLDER) or [p for p in [resolves(FOLDER)] if p]  # pip's dry run last
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    size = sum(w.size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB: {'; '.join(w.requirement for w in wheels)}"
          + ("" if FOLDER.is_dir() else f" ({FOLDER} absent: files not checked)"))
    return 1 if problems else 0


if __name__ == "__main__":
    from jaxlm import cli

    sys.exit(cli.run(main))
