"""The import graph of jaxlm, parity and experiments (read from the source with `ast`): no cycle, no upward import."""

import ast
import collections
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("jaxlm", "parity", "experiments", "torchref")
# Folders of jaxlm from the top layer down; a module may import its own layer or a lower one.
LAYERS = (("cli", "bench"), "training", ("nn", "data", "analysis"), "core")  # bench: the benchmark commands


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports; `from pkg import name` counts pkg.name when that is a module."""
    mods = modules()
    graph = collections.defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, path = {}, []

    def visit(u):
        state[u] = "open"
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                return path[path.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        path.pop()
        state[u] = "done"
        return None

    for u in sorted(graph):
        if u not in state and (found := visit(u)):
            return found
    return None


def test_the_checker_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "jaxlm" or len(parts) < 2 or parts[-1] == "__main__":
        return None  # the package itself and the `python -m` entry stubs (jaxlm/bench/__main__.py)
    for i, names in enumerate(LAYERS):
        if parts[1] in (names if isinstance(names, tuple) else (names,)):
            return i
    assert len(parts) == 2, f"{module}: jaxlm/{parts[1]}/ is in no layer of LAYERS"
    return None  # a `python -m` entry stub at the top (jaxlm/train.py)


def test_jaxlm_imports_only_down_and_never_the_lab():
    upward = []
    for src, targets in import_graph().items():
        for dst in targets:
            if src.startswith("jaxlm") and dst.split(".")[0] in ("torchref", "parity", "experiments"):
                upward.append(f"{src} -> {dst}")
            elif layer(src) is not None and layer(dst) is not None and layer(dst) < layer(src):
                upward.append(f"{src} -> {dst}")
    assert not upward, upward
