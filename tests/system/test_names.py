"""Every jaxlm, experiments and deliverables name written in the code, the docs and pyproject.toml resolves: a dotted
`jaxlm.a.b` is a module (a `python -m jaxlm.x` stub counts) or an attribute of one, and a `jaxlm/a/b.py` path exists."""

import dataclasses
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ("jaxlm", "parity", "experiments", "deliverables", "torchref", "tests")
TOP = r"(?<![\w./-])(?:jaxlm|experiments|deliverables)"
DOTTED = re.compile(TOP + r"(?:\.(?!md\b|toml\b|py\b)[A-Za-z_]\w*)+")  # not a file name (experiments.md)
PATH = re.compile(TOP + r"/[\w./]*\w")


def written_files(root: Path = REPO) -> list[Path]:
    """The *.py and *.md of the code folders, README.md, docs/**/*.md and pyproject.toml."""
    files = [root / "README.md", root / "pyproject.toml", *sorted((root / "docs").rglob("*.md"))]
    for folder in CODE:
        files += sorted(p for ext in ("*.py", "*.md") for p in (root / folder).rglob(ext))
    return [f for f in files if f.is_file() and f != Path(__file__).resolve()]  # this file plants stale names


def _module(dotted: str):
    """The longest importable prefix of `dotted` and the names after it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            return importlib.import_module(name), parts[i:]
        except ModuleNotFoundError as e:
            if e.name is None or not name.startswith(e.name):  # the module exists, one of its imports does not
                raise
    raise AssertionError(f"{dotted}: not even its package imports")


def resolves(dotted: str) -> bool:
    obj, rest = _module(dotted)
    for name in rest:
        if hasattr(obj, name):
            obj = getattr(obj, name)
        else:  # a dataclass field without a default is no class attribute
            return dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}
    return True


def unresolved(files: list[Path], root: Path = REPO) -> list[str]:
    """`file:line name` of every dotted name that does not resolve and every jaxlm/ path that does not exist."""
    bad, known = [], {}
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            names = [m.group() for m in DOTTED.finditer(line)]
            bad += [f"{f.relative_to(root)}:{n} {d}" for d in names if not known.setdefault(d, resolves(d))]
            line = line.replace("\\.", ".")  # a path written in a regular expression (nn/loss\\.py)
            bad += [f"{f.relative_to(root)}:{n} {p}" for p in (m.group() for m in PATH.finditer(line))
                    if not (REPO / p).exists() and not any(REPO.glob(p))]
    return bad


def test_a_planted_stale_name_is_found(tmp_path):
    planted = tmp_path / "stale.md"
    planted.write_text("The loss is `jaxlm.nn.loss.lm_loss`, run by `python -m jaxlm.train`;\n"
                       "the step is `jaxlm.train.build` (`jaxlm/training/loop.py`), its optimizer `jaxlm.optim`,\n"
                       "the state's `jaxlm.training.step.TrainState.params`, the model `jaxlm/model.py`.\n"
                       "Answers: `python -m deliverables.answers`, not `python -m experiments.answers` "
                       "(`experiments/answers/`; plans in experiments.md).\n")
    assert unresolved([planted], tmp_path) == ["stale.md:2 jaxlm.train.build", "stale.md:2 jaxlm.optim",
                                               "stale.md:3 jaxlm/model.py", "stale.md:4 experiments.answers",
                                               "stale.md:4 experiments/answers"]


def test_every_written_jaxlm_name_resolves():
    files = written_files()
    assert any(f.name == "pyproject.toml" for f in files) and any(f.name == "code.md" for f in files)
    bad = unresolved(files)
    assert not bad, "stale jaxlm names:\n" + "\n".join(bad)
