"""Values and files that reached XLA, NumPy or the OS unchecked, and messages that blamed the wrong thing
(issue 36, items 5, 9 and 14): each bad command line ends in one `error:` line naming the culprit (no
traceback, nothing created), and a few good ones say what they changed. All rows of a table run in one
process (tests/system/cli_harness.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxlm.core.config import load_config
from tests.system.cli_harness import run_one
from tests.system.fault_helpers import one_error, run_rows, sets
from tests.train_helpers import make_corpus, tiny_overrides

pytestmark = pytest.mark.xdist_group("faults_values")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A corpus, a small trained run, and the broken inputs the rows refer to."""
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("values")
    corpus = make_corpus(d / "corpus")
    run = d / "run"
    train(load_config(None, tiny_overrides(corpus, run, **{"train.steps": 2, "checkpoint.every": 2,
                                                           "log.tensorboard": "false"})))
    f = {"tmp": d, "corpus": corpus, "run": run, "binary": d / "binary.toml", "bom": d / "bom.toml"}
    f["binary"].write_bytes(bytes(range(256)) * 4)
    f["bom"].write_bytes(b"\xef\xbb\xbf[train]\nsteps = 2\n")
    f["edited"] = d / "edited"  # ids past the vocabulary written into train.bin, its size and mtime kept
    shutil.copytree(corpus, f["edited"])
    path = f["edited"] / "train.bin"
    stamp = path.stat()
    ids = np.fromfile(path, np.uint16)
    ids[:] = 300
    ids.tofile(path)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    return f


def _train(made, row: int, *extra: str) -> tuple[str, list[str]]:
    base = tiny_overrides(made["corpus"], made["tmp"] / f"out-{row}", **{"train.steps": 2, "train.eval_every": 2,
                                                                         "data.eval_tokens": 64})
    return "jaxlm.train", [*sets(base), *extra]


BIG = str(10**20)
# (args after the tiny run's flags, exit code, what the one error line names)
TRAIN_ROWS = [
    (["--set", f"model.d_model={BIG}"], 2, ["model.d_model", "2,147,483,647"]),
    (["--set", "model.d_model=2000000000"], 2, ["model.d_model = 2000000000", "choose a smaller model"]),
    (["--set", "model.vocab_size=2000000000", "--set", "model.d_model=4096"], 2,  # 61 TiB of weights
     ["model.vocab_size = 2000000000", "parameters take"]),
    (["--set", "model.vocab_size=10000000000"], 2, ["model.vocab_size", "2,147,483,647"]),
    (["--set", f"train.seed={2**70}"], 2, ["train.seed", "4,294,967,295"]),
    (["--set", "train.seed=-1"], 2, ["train.seed"]),
    (["--set", "optim.lr=1e400"], 2, ["optim.lr", "finite"]),
    (["--config", "{binary}"], 2, ["binary.toml", "not UTF-8"]),
    (["--set", 'data.dir="a\\u0000b"'], 2, ["data.dir", "NUL"]),
    (["--set", 'data.dir="{edited}"'], 2, ["train.bin", "token id 300", "prepare the data again"]),
]


def test_bad_values_and_files_are_one_line_each(made):
    rows = [_train(made, i, *[a.format(**made) for a in args]) for i, (args, _, _) in enumerate(TRAIN_ROWS)]
    rows += [
        ("jaxlm.generate", ["--run", made["run"], "--prompt", "x", "--seed", str(2**70)]),
        ("jaxlm.generate", ["--run", made["run"], "--prompt", "x", "--max-new-tokens", "3000000000"]),
        ("jaxlm.quantize", [made["run"], "--json", made["tmp"]]),
        ("jaxlm.quantize", [made["run"], "--json", "/proc/jaxlm-rows.json"]),
        ("jaxlm.data", ["download", "tinyshakespeare", "--root", "/proc/jaxlm-data"]),
        ("jaxlm.data", ["train-bpe", "--input", made["corpus"] / "corpus.txt", "--vocab-size", "300",
                        "--special-token", "", "--out", made["tmp"] / "bpe"]),
        ("jaxlm.lora", ["merge", made["run"], "--out", made["run"] / "merged"]),
    ]
    want = [(code, names) for _, code, names in TRAIN_ROWS] + [
        (2, ["--seed"]), (2, ["--max-new-tokens", "int32"]), (2, ["--json", "is a directory"]),
        (2, ["--json", "/proc/jaxlm-rows.json"]), (2, ["/proc/jaxlm-data"]), (2, ["--special-token"]),
        (2, ["--out", "inside the run being merged"])]
    results = run_rows(rows, made["tmp"] / "table")
    failures = [f"{m} {' '.join(map(str, a))}\n  {problem}" for (m, a), (code, names), got in zip(rows, want, results)
                if (problem := one_error(got, code, *names))]
    assert not failures, f"{len(failures)} of {len(rows)} rows:\n" + "\n".join(failures)
    created = [i for i in range(len(TRAIN_ROWS) - 1) if (made["tmp"] / f"out-{i}").exists()]  # the last one trains
    assert not created, [TRAIN_ROWS[i][0] for i in created]
    assert not (made["run"] / "merged").exists() and not (made["tmp"] / "bpe").exists()


def test_a_run_through_the_boundary_says_what_it_changed(made):
    """A BOM before the first table is skipped; a compute.loss_chunk below the micro-batch is raised, and said
    once; a prompt longer than the context is cut, with a warning."""
    rows = [_train(made, 100, "--config", made["bom"], "--set", "compute.loss_chunk=4"),
            ("jaxlm.generate", ["--run", made["run"], "--prompt", "ab" * 200, "--max-new-tokens", "2"])]
    train, generate = run_rows(rows, made["tmp"] / "good")
    assert train["code"] == 0, train["stderr"][-2000:]
    notes = [line for line in train["stderr"].splitlines() if "compute.loss_chunk = 4" in line]
    assert len(notes) == 1 and "blocks of 8 tokens" in notes[0], train["stderr"][-2000:]
    assert generate["code"] == 0, generate["stderr"][-2000:]
    assert "prompt 0 is 400 tokens, longer than model.context_length = 32" in generate["stderr"]


def test_a_metrics_line_that_is_not_utf8_is_dropped_by_the_report(made):
    """deliverables.report stopped on 0xff bytes in a metrics.jsonl ("unexpected UnicodeDecodeError"). In this
    process: the report needs no fresh JAX."""
    run = made["tmp"] / "garbled"
    shutil.copytree(made["run"], run)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"\xff\xfe{not json\n")
    got = run_one("deliverables.report", [str(run), "--out", str(made["tmp"] / "garbled-report")], str(made["tmp"]))
    assert got["code"] == 0, got["stderr"][-2000:]
    assert "val" in (made["tmp"] / "garbled-report" / "report.md").read_text().lower()


def test_an_inline_table_sets_its_keys_and_keeps_the_others(tmp_path):
    """`--set 'train={steps=3}'` used to replace the whole [train] section (its out_dir too) with defaults."""
    path = tmp_path / "c.toml"
    path.write_text('[train]\nout_dir = "runs/mine"\neval_every = 7\n')
    cfg = load_config(path, ["train.seed=5", "train={steps=3}", "model={d_model=64, num_heads=4}"])
    assert (cfg.train.steps, cfg.train.out_dir, cfg.train.eval_every, cfg.train.seed) == (3, "runs/mine", 7, 5)
    assert (cfg.model.d_model, cfg.model.num_heads) == (64, 4)


def test_host_memory_bounds_the_tokens_generate_may_hold(made):
    """10^9 new tokens (about 48 bytes each held on the host: 45 GiB) are refused naming the memory that binds
    (under `ulimit -v` 8 GiB, so on any machine); the same command with 20 tokens runs."""
    import resource

    rows = [("jaxlm.generate", ["--run", made["run"], "--prompt", "x", "--max-new-tokens", str(n)])
            for n in (10**9, 20)]
    limit, hard = 8 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip("the hard address-space limit is below 8 GiB already")
    refused, ran = run_rows(rows, made["tmp"] / "rlimit", address_space=limit)
    assert one_error(refused, 2, "--max-new-tokens 1000000000", "of host memory, but") is None, refused["stderr"]
    assert ran["code"] == 0, ran["stderr"][-2000:]


def test_paths_and_values_past_the_systems_limits_are_one_line_each(made):
    """Issue 46, items 12 and 18: an output directory in a symbolic link loop ("unexpected RuntimeError: Symlink
    loop"), with a name or a length past the system's limits ("unexpected OSError: File name too long"), a
    5000-digit integer ("unexpected ValueError: Exceeds the limit (4300 digits)") on the command line or in a file,
    a 100 kB value (echoed whole), optim.eps = 0 (accepted; the NaN at step 1 blamed on the learning rate): one
    short line each, naming the key or flag."""
    tmp = made["tmp"]
    loop = tmp / "loop"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    (tmp / "huge.toml").write_text(f"[train]\nsteps = {'9' * 5000}\n")
    out = lambda path: ["--set", f'train.out_dir="{path}"']  # noqa: E731
    table = [
        (_train(made, 200, *out(loop / "run")), ["train.out_dir", "symbolic link loop"]),
        (_train(made, 201, *out(tmp / ("d" * 300))), ["train.out_dir", "more than a file system allows"]),
        (_train(made, 202, *out("/".join([str(tmp), *["e" * 200] * 25]))), ["train.out_dir", "more than the system"]),
        (_train(made, 203, "--set", f"train.steps={'9' * 5000}"), ["--set train.steps=", "too long to read"]),
        (_train(made, 204, "--config", str(tmp / "huge.toml")), ["huge.toml: line 2 (steps = ...)", "too long"]),
        (_train(made, 205, "--set", f'data.source="{"a" * 100_000}"'), ["--set data.source=", "expected a list"]),
        (_train(made, 206, "--set", "optim.eps=0"), ["optim.eps = 0.0", "0/0 = NaN"]),
        (("jaxlm.lora", ["merge", made["run"], "--out", loop / "merged"]), ["--out", "symbolic link loop"]),
        (("deliverables.report", [made["run"], "--out", loop / "report"]), ["cannot hold the report", "link loop"]),
    ]
    results = run_rows([row for row, _ in table], tmp / "limits")
    failures = [f"{m} {' '.join(map(str, a))[:300]}\n  {problem}" for ((m, a), names), got in zip(table, results)
                if (problem := one_error(got, 2, *names))]
    assert not failures, f"{len(failures)} of {len(table)} rows:\n" + "\n".join(failures)
    long = [len(got["stderr"]) for got in results if len(got["stderr"]) > 2500]
    assert not long, long
    assert not [p.name for p in tmp.iterdir() if p.name.startswith(("out-20", "d" * 300, "e" * 200))]
