"""Every fenced shell command in README.md and docs/**/*.md runs as written.

Each `python -m MODULE ...` is parsed by the command's own argument parser (run in this process up to its
`parse_args`, which is stopped there), then its `--config/--preset/--set` are loaded by the config loader and a
plan name by the plan loader: a renamed module, subcommand, flag, config key or plan fails here. A few commands
run for real, at a smoke size (tests/system/test_docs_run.py). Commands that need a GPU or the network are
listed with the reason (GPU_OR_NETWORK): parsed like the others, never run. Other programs (pip, tensorboard)
are checked as far as they touch the project: pip's extras and pins against pyproject.toml.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import signal
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from jaxlm.cli import registry

REPO = Path(__file__).resolve().parents[2]
SHELL = {"bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.S | re.M)
SEPARATORS = {"&&", "||", ";", "&", "|"}

# Commands that need a GPU or the network: parsed (above), never run here. (pattern, why)
GPU_OR_NETWORK = (
    (r"^pip install", "installs from the package index (network)"),
    (r"jaxlm\.data download", "downloads a corpus (network)"),
    (r"deliverables\.gpu\.carry (download|check)", "downloads wheels, or checks the downloaded ones (network)"),
    (r"jaxlm\.hf import HuggingFaceTB/", "downloads a checkpoint from the Hub (network)"),
    (r"runs/smollm2-(135m|lora|qlora)|smollm2_lora\.toml($| --set 'lora)",
     "uses the Hub checkpoint (network); a GPU job"),
    (r"--size gpu", "a plan's GPU-sized variant"),
    (r"jaxlm\.train --config experiments/configs/shakespeare_char_gpu\.toml$",
     "trains with cuDNN attention on an NVIDIA GPU (compiled for one by test_gpu_quick_start_compiles_for_a_gpu)"),
    (r"--framework both --json runs/bench/small\.json|--attention xla cudnn --find-max-batch$",
     "timed on an NVIDIA GPU (docs/benchmarks.md)"),
    (r"--mode cache --json small_b32", "decoding on an NVIDIA GPU"),
    (r"^tensorboard ", "a server: started by hand"),
)
# Programs other than python that the docs may name: checked by `check_other`.
OTHER = {"pip", "tensorboard", ".", "cd", "git"}
SUBCOMMANDS = {c.module for c in registry.commands() if c.subcommands}  # each subcommand has its own --help
@dataclass(frozen=True)
class Command:
    where: str  # FILE:LINE
    text: str  # as written (continuations joined, comments dropped)
    argv: tuple[str, ...]


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def split_commands(line: str) -> list[list[str]]:
    """One shell line (comments dropped) as the simple commands between `&&`, `;`, `|` ...; `VAR=x` prefixes
    dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    out, cur = [], []
    for tok in lexer:
        if tok in SEPARATORS:
            out, cur = out + [cur], []
        else:
            cur.append(tok)
    out.append(cur)
    return [c[next((i for i, t in enumerate(c) if not re.fullmatch(r"[A-Z_]+=\S*", t)), len(c)):] for c in out if c]


def commands_in(path: Path, root: Path = REPO) -> tuple[list[Command], list[str]]:
    """The commands of `path`'s shell blocks, and the untagged blocks that hold a command (a command must not
    hide from this test: synopses and output are tagged `text`)."""
    text, found, untagged = path.read_text(), [], []
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        first = text.count("\n", 0, m.start(2)) + 1
        if lang not in SHELL:
            if not lang and re.search(r"^\s*(python3?|pip) ", body, re.M):
                untagged.append(f"{path.relative_to(root)}:{first}")
            continue
        lines = body.replace("\\\n", " ").splitlines()
        for offset, line in enumerate(lines):
            for argv in split_commands(line):
                where = f"{path.relative_to(root)}:{first + offset}"
                found.append(Command(where, shlex.join(argv), tuple(argv)))
    return found, untagged


ALL = [c for f in doc_files() for c in commands_in(f)[0]]
INLINE_CODE = re.compile(r"`(python3? -m [^`]+)`")
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*|\.\.\.")  # WHAT, PLAN, RUN_DIR, an elided rest


def inline_commands(path: Path, root: Path = REPO) -> list[Command]:
    """The `python -m ...` spans of the prose (outside fenced blocks), a span broken over lines joined, optional
    [brackets] opened and `...` dropped. A span that names only a command (its words but placeholders) stands for
    the command: its --help is what is checked."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    found = []
    for m in INLINE_CODE.finditer(text):
        words = [w.removeprefix("[") for w in shlex.split(m.group(1)) if w != "..."]  # [--out DIR]: optional
        argv = [w.removesuffix("]") if w.endswith("]") and "[" not in w else w for w in words]
        if all(PLACEHOLDER.fullmatch(a) for a in argv[4 if argv[2] in SUBCOMMANDS else 3:]):
            argv = [a for a in argv if not PLACEHOLDER.fullmatch(a)] + ["--help"]
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}"
        found.append(Command(where, shlex.join(argv), tuple(argv)))
    return found


INLINE = [c for f in doc_files() for c in inline_commands(f)]


class _Parsed(BaseException):
    """Raised from inside the command once its arguments are parsed: nothing of the job runs."""

    def __init__(self, namespace):
        self.namespace = namespace


@contextlib.contextmanager
def _stopped_at_parse():
    original = argparse.ArgumentParser.parse_args
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def parse_args(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original
        for s, h in handlers.items():
            signal.signal(s, h)


def parse(module: str, args: list[str], out: io.StringIO | None = None) -> argparse.Namespace | None:
    """MODULE's own parser on ARGS; None after a clean exit (--help, whose text goes to `out`). Fails with the
    command's error line."""
    saved, err = sys.argv, io.StringIO()
    sys.argv = [module, *args]
    try:
        with _stopped_at_parse(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out or io.StringIO()):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed as p:
        return p.namespace
    except SystemExit as e:
        if e.code in (0, None):
            return None
        pytest.fail(f"exit {e.code}: {err.getvalue().strip()[-400:]}")
    finally:
        sys.argv = saved
    pytest.fail("the command ran without parsing arguments")


def check_python(module: str, args: list[str]) -> None:
    if module == "venv":
        return
    if module == "pytest":
        missing = [a for a in args if a.startswith("tests/") and not (REPO / a.split("::")[0]).exists()]
        assert not missing, f"no such test file: {missing}"
        return
    ns = parse(module, args)
    if ns is None:
        return
    if hasattr(ns, "overrides"):
        from jaxlm.core.config import load_config

        if ns.config is None or os.path.isabs(ns.config):
            config = ns.config
        elif ns.config.startswith("runs/"):  # a run's config.toml, written by an earlier command: the flags alone
            config = None
        else:
            config = str(REPO / ns.config)
        load_config(config, ns.overrides, preset=ns.preset)
    if module == "experiments.run" and ns.plan:
        from experiments.plan import load_plan

        load_plan(ns.plan, ns.size)


def check_other(argv: list[str]) -> None:
    """pip's extras and pins must be pyproject.toml's; the other programs are named in OTHER."""
    assert argv[0] in OTHER, f"{argv[0]}: a program this test does not know; add it to OTHER or fix the doc"
    if argv[0] != "pip":
        return
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(d) for ds in [*extras.values(), project["dependencies"]] for d in ds]
    for arg in argv[2:]:
        if m := re.fullmatch(r"\.?\[([\w,-]+)\]", arg):
            unknown = [e for e in m.group(1).split(",") if e not in extras]
            assert not unknown, f"pip extras {unknown} are not in pyproject.toml"
        elif "==" in arg:
            pin = Requirement(arg)
            version = next(iter(pin.specifier)).version
            assert all(version in r.specifier for r in wanted if r.name == pin.name), \
                f"{arg}: outside pyproject.toml's requirement"


def check(command: Command) -> None:
    argv = list(command.argv)
    if argv[0] in ("python", "python3") and argv[1:2] == ["-m"]:
        check_python(argv[2], argv[3:])
    elif argv[0] in ("python", "python3"):
        assert argv[1] == "-c", f"{command.text}: run Python code with -m MODULE or -c"
    else:
        check_other(argv)


def needs_gpu_or_network(command: Command) -> str | None:
    return next((why for pattern, why in GPU_OR_NETWORK if re.search(pattern, command.text)), None)


@pytest.mark.parametrize("command", ALL, ids=[f"{c.where} {c.text[:70]}" for c in ALL])
def test_documented_command_parses(command):
    check(command)


def test_every_command_in_the_prose_parses():
    """The prose's `python -m ...` spans, in one test (they repeat the blocks' commands): a flag renamed in the code,
    or one that never existed, fails here too, wherever the span breaks its line."""
    failed = []
    for command in INLINE:
        try:
            check(command)
        except BaseException as e:  # pytest.fail's Failed, an assertion, the command's own error
            failed.append(f"{command.where} {command.text}: {str(e).strip()[:200]}")
    assert not failed, "\n".join(failed)


def test_a_command_broken_over_two_lines_of_prose_is_checked(tmp_path):
    planted = tmp_path / "page.md"
    planted.write_text("The report (`python -m deliverables.report\n--all ROOT --out DIR`) and `python -m jaxlm.bench\n"
                       "WHAT` and `python -m experiments.run PLAN [--dry-run]`.\n")
    first, mention, synopsis = inline_commands(planted, tmp_path)
    assert first.argv == ("python", "-m", "deliverables.report", "--all", "ROOT", "--out", "DIR")
    with pytest.raises(BaseException, match="unrecognized arguments: --all"):
        check(first)
    assert mention.argv == ("python", "-m", "jaxlm.bench", "--help") and synopsis.argv[-1] == "--dry-run"
    check(mention)


def _command_word(c: Command) -> tuple[str, ...]:
    """`python -m MODULE [SUBCOMMAND]` of a documented command: what its --help describes."""
    return tuple(c.argv[2:4]) if c.argv[2] in SUBCOMMANDS and len(c.argv) > 3 else (c.argv[2],)


HELPED = sorted({_command_word(c) for c in ALL
                 if c.argv[:2] == ("python", "-m") and c.argv[2] not in ("venv", "pytest")})


@pytest.mark.parametrize("word", HELPED, ids=[" ".join(w) for w in HELPED])
def test_help_names_the_extra_it_needs(word):
    """Every documented command's --help says what it needs installed: the core install or an extra."""
    out = io.StringIO()
    parse(word[0], [*word[1:], "--help"], out)
    text = " ".join(out.getvalue().split())
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = rf"core install|'?({'|'.join(map(re.escape, extras))})'? extra"
    assert re.search(named, text), f"python -m {' '.join(word)} --help names neither the core install nor an extra"


@pytest.mark.filterwarnings("ignore::RuntimeWarning:runpy")  # a package that imported its command
@pytest.mark.parametrize("command", registry.commands(), ids=lambda c: c.module)
def test_every_registered_command_says_what_it_needs(command):
    """`python -m MODULE --help` ends with the registry's "Needs ..." (what `python -m jaxlm` lists)."""
    out = io.StringIO()
    parse(command.module, ["--help"], out)
    assert "".join(f"Needs {command.needs}.".split()) in "".join(out.getvalue().split()), out.getvalue()[-300:]


def test_every_documented_command_is_registered():
    """Each `python -m MODULE` of the docs is one `python -m jaxlm` lists (jaxlm.cli.registry), or the list
    itself, pytest or venv."""
    known = {c.module for c in registry.commands()} | {"jaxlm", "pytest", "venv"}
    found = sorted({f"{c.where} {c.argv[2]}" for c in ALL
                    if c.argv[0] in ("python", "python3") and c.argv[1:2] == ("-m",) and c.argv[2] not in known})
    assert not found, f"documented commands missing from the registry: {found}"


def test_no_command_in_an_untagged_block():
    untagged = [u for f in doc_files() for u in commands_in(f)[1]]
    assert not untagged, f"untagged blocks holding a command (tag them bash, or text for a synopsis): {untagged}"


def test_every_gpu_or_network_command_is_listed_for_a_reason():
    """The list is exact: each pattern still matches a documented command."""
    for pattern, why in GPU_OR_NETWORK:
        assert any(re.search(pattern, c.text) for c in ALL), f"{pattern} ({why}) matches no documented command"


@pytest.mark.parametrize("bad", [
    "python -m jaxlm" + ".trian --config experiments/configs/quickstart.toml",  # a renamed module (split: test_names)
    "python -m jaxlm.bench modle --preset small",  # a renamed subcommand
    "python -m jaxlm.bench model --preset small --contxt 128",  # a renamed flag
    "python -m jaxlm.train --config experiments/configs/quickstart.toml --set optim.lrr=1e-3",  # a config key
    "python -m experiments.run lr_swep --dry-run",  # a renamed plan
    'pip install -e ".[tourch]"',  # a renamed extra
])
def test_a_renamed_name_fails(bad):
    argv = tuple(shlex.split(bad))
    with pytest.raises(BaseException) as caught:
        check(Command("planted", bad, argv))
    assert not isinstance(caught.value, (KeyboardInterrupt, SystemExit))


def test_accumulated_batch_is_estimated_one_micro_batch_at_a_time(capsys):
    """docs/memory.md's gpt2_small example: 512 sequences in 8 micro-batches hold what one step of 64 holds."""
    from jaxlm.cli import memory

    config = str(REPO / "experiments/configs/gpt2_small.toml")
    memory.main(["--config", config, "--memory", "24GiB", "--json"])
    accumulated = json.loads(capsys.readouterr().out)
    memory.main(["--config", config, "--memory", "24GiB", "--json", "--batch", "64", "--set", "train.grad_accum=1"])
    single = json.loads(capsys.readouterr().out)
    assert (accumulated["batch"], accumulated["micro_batch"], accumulated["grad_accum"]) == (512, 64, 8)
    assert accumulated["peak_bytes"] == single["peak_bytes"]
    assert accumulated["largest_batch"] == 8 * single["largest_batch"]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (but - and _), spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """The relative links of `path` whose file or #anchor does not exist."""
    broken, text = [], path.read_text()
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.relative_to(root)}: {target}")
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", dest.read_text()), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(f"{path.relative_to(root)}: {target}")
    return broken


def test_links_and_anchors_resolve():
    broken = [b for f in doc_files() for b in broken_links(f)]
    assert not broken, f"links to a missing file or heading: {broken}"
