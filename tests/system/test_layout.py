"""The import graph of jaxlm, parity, experiments and deliverables (read from the source with `ast`): no cycle, no
upward import."""

import ast
import collections
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("jaxlm", "parity", "experiments", "deliverables", "torchref")
# Folders of jaxlm from the top layer down; a module may import its own layer or a lower one. bench sits above
# cli: the benchmark commands use cli's helpers, and no command of cli imports a benchmark. predict (compile for a
# GPU, price the program) sits beside hf, above training: it compiles training's own step, and training never
# predicts.
LAYERS = ("bench", "cli", ("hf", "predict"), "training", ("nn", "data", "analysis"), "core")


def modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
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


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports into the lab, torch's side or a higher layer of jaxlm (function-local imports count)."""
    upward = []
    for src, targets in graph.items():
        for dst in targets:
            if src.startswith("jaxlm") and dst.split(".")[0] in ("torchref", "parity", "experiments", "deliverables"):
                upward.append(f"{src} -> {dst}")
            elif layer(src) is not None and layer(dst) is not None and layer(dst) < layer(src):
                upward.append(f"{src} -> {dst}")
    return upward


def test_the_layer_checker_refuses_cli_importing_bench_and_training_importing_predict():
    assert upward_imports({"jaxlm.cli.memory": {"jaxlm.bench.kernels"}}) == ["jaxlm.cli.memory -> jaxlm.bench.kernels"]
    assert upward_imports({"jaxlm.training.loop": {"jaxlm.predict.compile"}}) == [
        "jaxlm.training.loop -> jaxlm.predict.compile"]
    assert upward_imports({"jaxlm.bench.sweep": {"jaxlm.cli", "jaxlm.predict.rows"},
                           "jaxlm.predict.compile": {"jaxlm.training.loop", "jaxlm.analysis.memory"}}) == []


def test_jaxlm_imports_only_down_and_never_the_lab():
    assert not (upward := upward_imports(import_graph())), upward


# Beside jaxlm: torchref stands alone, parity may import jaxlm and torchref, experiments (the lab's runner) those,
# deliverables (built on the runner) anything.
MAY_IMPORT = {"jaxlm": {"jaxlm"}, "torchref": {"torchref"}, "parity": {"parity", "jaxlm", "torchref"},
              "experiments": {"experiments", "jaxlm", "parity", "torchref"},
              "deliverables": {"deliverables", "experiments", "jaxlm", "parity", "torchref"}}


def wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
            if dst.split(".")[0] not in MAY_IMPORT[src.split(".")[0]]]


def test_the_package_checker_refuses_the_runner_importing_a_deliverable():
    assert wrong_imports({"experiments.run": {"deliverables.headline"}}) == ["experiments.run -> deliverables.headline"]
    assert wrong_imports({"deliverables.headline": {"experiments.results"}}) == []


def test_packages_import_only_what_sits_below_them():
    assert not (wrong := wrong_imports(import_graph())), wrong


BESIDE = ("torchref", "parity", "experiments", "deliverables")  # what jaxlm never names: they register themselves
NAMED = re.compile(r"(?<![\w-])(?:" + "|".join(BESIDE) + r")(?![\w-])")


def names_beside(source: str) -> list[str]:
    """The strings and names of `source` (docstrings and comments aside: they may say what uses the code) that name
    a package beside jaxlm, as 'line: text'."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
            ast.AsyncFunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)}
    texts = [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docs]
    texts += [(n.lineno, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name)]
    texts += [(n.lineno, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    return [f"{line}: {text[:80]}" for line, text in texts if NAMED.search(text)]


def test_the_name_checker_finds_the_lab_in_code_not_in_docstrings():
    source = ('"""Used by experiments.run."""\nPACKAGES = ("jaxlm", "deliverables")\nEXTRAS = {"torchref": "torch"}\n'
              'def f():\n    """parity reads it"""\n    return parity_check  # experiments\n')
    assert sorted(names_beside(source)) == ["2: deliverables", "3: torchref"]
    assert names_beside('x = "an experiments-free name"; y = "parity_check"') == []


def test_jaxlm_names_no_package_beside_it():
    """The packages beside jaxlm register their commands, names and extras (jaxlm.core.plugins): jaxlm's code names
    none of them, not even as a string."""
    found = {str(p.relative_to(REPO)): hits for p in sorted((REPO / "jaxlm").rglob("*.py"))
             if (hits := names_beside(p.read_text()))}
    assert not found, found


# Within the deliverables the written report reads the plans' reports and the answers, and the answers read the
# reports (the divergence definition): one way, written -> answers -> report.
DELIVERABLES_BELOW = {"deliverables.report": {"deliverables.answers", "deliverables.written"},
                      "deliverables.answers": {"deliverables.written"}}


def deliverable_ties(graph: dict[str, set[str]]) -> list[str]:
    return [f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
            for low, above in DELIVERABLES_BELOW.items()
            if src.startswith(low + ".") and any(dst == a or dst.startswith(a + ".") for a in above)]


def test_the_report_answers_and_written_report_tie_one_way():
    assert deliverable_ties({"deliverables.report.build": {"deliverables.answers.gpu"}}) == [
        "deliverables.report.build -> deliverables.answers.gpu"]
    assert deliverable_ties({"deliverables.written.claims": {"deliverables.answers", "deliverables.report"}}) == []
    assert not (ties := deliverable_ties(import_graph())), ties


def private_imports(package: str, root: Path = REPO) -> list[str]:
    """`from mod import _name` and `mod._name` where mod is another module of the project."""
    mods, found = modules(root), []
    for name, path in mods.items():
        if not name.startswith(package):
            continue
        aliases = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "") in mods and node.module != name:
                found += [f"{name}: from {node.module} import {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
                aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in mods}
            elif isinstance(node, ast.Import):
                aliases |= {a.asname or a.name for a in node.names if a.name in mods}
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                found.append(f"{name}: {node.value.id}.{node.attr}")
    return found


def test_the_private_name_checker_finds_a_crossing(tmp_path):
    (tmp_path / "parity").mkdir()
    (tmp_path / "parity" / "__init__.py").write_text("")
    (tmp_path / "parity" / "a.py").write_text("def _helper(): pass\n_helper()\n")
    (tmp_path / "parity" / "b.py").write_text("from parity.a import _helper\nfrom parity import a\na._helper()\n")
    assert private_imports("parity", tmp_path) == ["parity.b: from parity.a import _helper", "parity.b: a._helper"]


def test_no_private_name_crosses_a_module_in_the_lab():
    assert not any(private_imports(p) for p in ("experiments", "deliverables", "parity"))


SIZED = ("jaxlm", "experiments", "deliverables", "parity", "tests")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_files_and_functions_stay_readable():
    long = []
    for pkg in SIZED:
        for path in sorted((REPO / pkg).rglob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) > MAX_FILE_LINES:
                long.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
            long += [f"{path.relative_to(REPO)}:{n.lineno} {n.name}: {n.end_lineno - n.lineno + 1} lines"
                     for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long



def imported_modules(path: Path, root: Path = REPO) -> set[str]:
    """Every module a file imports, anywhere in it (inside functions too); `from a import b` counts a and a.b."""
    package = path.relative_to(root).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:  # relative to the file's package
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


TORCH = ("torch", "torchref", "parity", "tests.parity", "tests.adapters")  # and what imports it


def torch_imports(path: Path, root: Path = REPO) -> list[str]:
    return sorted(m for m in imported_modules(path, root) if any(m == t or m.startswith(f"{t}.") for t in TORCH))


def test_the_torch_import_reader_looks_everywhere(tmp_path):
    (tmp_path / "tests" / "lib").mkdir(parents=True)
    (tmp_path / "tests" / "lib" / "t.py").write_text("import numpy\ndef f():\n    from torch import nn\n"
                                                     "from ..parity import hf_models\nimport parity_like\n"
                                                     "from .. import adapters\n")
    assert torch_imports(tmp_path / "tests" / "lib" / "t.py", tmp_path) == [
        "tests.adapters", "tests.parity", "tests.parity.hf_models", "torch", "torch.nn"]


def test_the_library_tests_run_on_the_core_install():
    """tests/lib imports neither torch nor what needs it (.ci/run runs it on a bare `pip install -e .`)."""
    found = {str(p.relative_to(REPO)): torch_imports(p) for p in sorted((REPO / "tests" / "lib").glob("*.py"))}
    assert not {k: v for k, v in found.items() if v}
