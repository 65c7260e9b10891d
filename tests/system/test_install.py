"""The core install is lean: training, sampling, checkpoints, logging and data need neither torch nor
matplotlib; the extras that bring them fail in one line naming themselves."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from jaxlm.core import extras
from jaxlm.core.errors import MissingExtra, UserError

REPO = Path(__file__).resolve().parents[2]


def test_core_dependencies_leave_torch_and_matplotlib_to_extras_and_ci_installs_them():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "torch" not in core and "matplotlib" not in core and "xprof" not in core
    opt = project["optional-dependencies"]
    assert {"torch", "plots", "profile", "gpu-compile", "hf", "pytest", "test", "cuda12", "cuda13"} <= set(opt)
    # the test extra stays small: no GPU compiler, no xprof (their tests skip, naming them; .ci/run installs them)
    test = " ".join(opt["test"])
    assert all(e in test for e in ("torch", "plots", "hf", "pytest", "transformers", "peft"))
    assert not any(e in test for e in ("profile", "gpu-compile", "xprof", "cuda"))
    ci = (REPO / ".ci" / "run").read_text()
    assert '-e ".[pytest]"' in ci and '-e ".[test,gpu-compile,profile]"' in ci
    # the CUDA plugin must match jaxlib exactly: jax's own cuda12-local extra pins it to jax's version
    assert "jax[cuda12-local]" in opt["gpu-compile"]


def test_the_project_states_its_license():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().startswith("MIT License")


def readme_test_command() -> str:
    """The first line of the first bash block under README.md's "## Tests" (what .ci/run extracts and runs)."""
    tests = (REPO / "README.md").read_text().split("\n## Tests\n", 1)[1]
    return tests.split("```bash\n", 1)[1].splitlines()[0]


def test_ci_runs_the_readme_test_command_as_a_new_user_would():
    """The README's command installs PyTorch's CPU build where its index is reachable and any torch 2.13.0 where
    not, then the test extra, then runs the default suite; CI runs exactly that line with no data root and a
    fresh HOME, then the corpus and extra tests it skipped with both."""
    command = readme_test_command()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in command and "--index-url" not in \
        command.replace("--extra-index-url", "")
    assert 'pip install -e ".[test]"' in command and command.endswith("&& python -m pytest")
    ci = (REPO / ".ci" / "run").read_text()
    awk = "awk '/^## Tests/ { in_tests = 1 } in_tests && /^```bash/ { getline; print; exit }' README.md"
    assert awk in ci and 'env -u JAXLM_DATA HOME="$(mktemp -d)" bash -euo pipefail -c "$readme_command"' in ci
    assert subprocess.run(["bash", "-c", awk], cwd=REPO, capture_output=True, text=True).stdout.strip() == command
    assert 'python -m pytest -m "(corpus or extra) and not extended"' in ci


def test_the_library_imports_neither_its_reference_nor_its_lab():
    """Every jaxlm module imported (or, on the core install, naming its missing extra): torch, torchref, parity,
    experiments and deliverables stay out."""
    code = ("import importlib, pkgutil, sys, jaxlm\n"
            "from jaxlm.core.errors import MissingExtra\n"
            "for m in pkgutil.walk_packages(jaxlm.__path__, 'jaxlm.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    try: importlib.import_module(m.name)\n"
            "    except MissingExtra: pass  # a module of an extra, on the core install: it names the extra\n"
            "lab = ('torch', 'torchref', 'parity', 'experiments', 'deliverables')\n"
            "print(sorted(m for m in lab if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=600)
    assert out.stdout.strip() == "[]"


def test_core_commands_import_neither_plots_nor_profiler():
    code = ("import sys, jaxlm.cli.train, jaxlm.cli.generate, jaxlm.training.checkpoint, jaxlm.data.prepare, "
            "jaxlm.data.loader, jaxlm.bench.commands, experiments.run; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'xprof') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=600)
    assert out.stdout.strip() == "[]"


def test_a_missing_extra_is_named_in_one_line(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(f"No module named '{name}'", name=name.split(".")[0])

    assert extras.known()["matplotlib"] == "plots"  # declared by the report's package (deliverables/registry.py)
    monkeypatch.setattr(extras.importlib, "import_module", missing)
    with pytest.raises(MissingExtra, match=r"^matplotlib is not installed; it comes with the 'plots' extra: "
                                           r"pip install -e '\.\[plots\]'$") as e:
        extras.require("matplotlib")
    assert isinstance(e.value, UserError) and isinstance(e.value, ImportError) and e.value.exit_code == 1
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match=r"^error: torch is not installed; it comes with the 'torch' extra"):
        extras.exit_unless_installed("torch")


def test_a_python_without_the_install_says_so_and_writes_nothing_into_the_run(tmp_path):
    """A new shell without the venv: `python -S` runs jaxlm from the checkout with none of its dependencies. One
    line naming the missing module, this Python and how to fix it; no error.log written into the existing run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("")
    r = subprocess.run([sys.executable, "-S", "-m", "jaxlm.train", "--config", "experiments/configs/quickstart.toml",
                        "--set", f'train.out_dir="{run}"'], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("error:") == 1, r.stderr
    assert f"is not installed in this Python ({sys.executable})" in r.stderr and "pip install -e ." in r.stderr
    assert "unexpected" not in r.stderr and sorted(p.name for p in run.iterdir()) == ["config.toml"]


def test_python_m_jaxlm_lists_the_library_and_what_the_packages_beside_it_register():
    """From a checkout (whatever the installed metadata says): the library's commands, then the lab's, read from the
    checkout's pyproject.toml."""
    from jaxlm.cli import registry

    r = subprocess.run([sys.executable, "-m", "jaxlm"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-2000:]
    listed = [line.split()[2] for line in r.stdout.splitlines() if line.startswith("  python -m ")]
    assert listed == [c.module for c in registry.commands()]
    assert listed[:len(registry.LIBRARY)] == [c.module for c in registry.LIBRARY]
    assert {"experiments.run", "parity.check", "deliverables.report"} <= set(listed)


def test_entry_points_come_from_a_checkout_else_from_the_installed_metadata(tmp_path):
    """A checkout's pyproject.toml: its installed entry points and its checkout-only ones ([tool.jaxlm.entry-points],
    packages run from the checkout, not installed); an absent package names no command."""
    from importlib import metadata

    from jaxlm.core import plugins

    group = "jaxlm.bench.sides"
    installed = sorted((e.name, e.value) for e in metadata.entry_points(group=group))
    assert sorted((e.name, e.value) for e in plugins.entry_points(group, tmp_path / "none.toml")) == installed
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "other"\n')
    assert sorted((e.name, e.value) for e in plugins.entry_points(group, tmp_path / "pyproject.toml")) == installed
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "jaxlm"\n[project.entry-points."{plugins.REGISTRY}"]\n'
                                             'gone = "no_such_package.registry:COMMANDS"\n'
                                             f'[tool.jaxlm.entry-points."{plugins.REGISTRY}"]\n'
                                             'lab = "experiments.registry:COMMANDS"\n')
    points = plugins.entry_points(plugins.REGISTRY, tmp_path / "pyproject.toml")
    assert [ep.name for ep in points] == ["gone", "lab"]
    assert [c.module for ep in points for c in plugins.loaded(ep) or ()] == ["experiments.run"]
