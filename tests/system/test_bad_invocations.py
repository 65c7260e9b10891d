"""A table of bad invocations across every CLI: each row's exit code, one `error:` line naming the culprit, no
traceback."""

from __future__ import annotations

import pytest

from jaxlm.cli import registry
from tests.system.fault_helpers import needs_of, one_error, run_rows, sets
from tests.train_helpers import tiny_overrides, xla_devices

pytestmark = pytest.mark.xdist_group("faults-files")  # the broken inputs are built once

# module -> (args, exit code, culprit the error line must name). {names} are files made below.
INVOCATIONS = {
    "jaxlm.train": [
        ("--set train.steps=-5", 2, "train.steps"),
        ("--set optim.lrr=1", 2, "--set optim.lrr=1"),
        ("--config {tmp}/missing.toml", 2, "missing.toml"),
        ("--config {bad_toml}", 2, "bad.toml"),
        ("--preset nope", 2, "nope"),
        ("--bogus-flag", 2, "--bogus-flag"),
        ("--resume=maybe", 2, "--resume"),
        ("--set model.num_heads=3", 2, "num_heads"),
        ("--set compute.dtype=\"float16\"", 2, "compute.dtype"),
        ("--set train.steps=abc", 2, "train.steps"),
        ("--set log.profile_steps=[5]", 2, "log.profile_steps"),
        ("--set data.dir=\"{tmp}/fresh\" --set data.source=[\"{tmp}/missing.txt\"]", 2, "missing.txt"),
        ("--set data.dir=\"{tmp}/fresh\" --set data.source=[\"{empty}\"]", 2, "empty.txt"),
        ("--set data.dir=\"{tmp}/no_data\"", 2, "data.source"),
        ("--set data.dir=\"{no_train}\"", 2, "train.bin"),
        ("--set data.dir=\"{short_val}\"", 2, "val.bin"),
        ("--set data.dir=\"{out_of_range}\"", 2, "train.bin"),
        ("--set model.vocab_size=100", 2, "model.vocab_size"),
        ("--set train.out_dir=\"{file}/run\"", 2, "train.out_dir"),
        ("--set train.out_dir=\"/proc/jaxlm-run\"", 2, "train.out_dir"),
        ("--set train.out_dir=\"\"", 2, "train.out_dir"),
        ("--set compute.attention=\"cudnn\" --set compute.dtype=\"bfloat16\"", 2, "compute.attention"),
        ("--set data.batch_size=12", 2, "data.batch_size"),  # 8 simulated devices
        ("--set parallel.distributed=true", 2, "parallel.distributed"),
        ("--set train.out_dir=\"{run}\" --set model.d_model=64", 2, "model.d_model: checkpoint 32, config 64"),
        ("--set train.out_dir=\"{run}\" --no-resume", 2, "checkpoint.resume"),
        ("--set train.out_dir=\"{corrupt}\" --set train.steps=8", 2, "no checkpoint restores"),
        ("--set train.out_dir=\"{bad_config_run}\"", 2, "config.toml"),
        ("--set train.out_dir=\"{run}\" --set data.dir=\"{bpe_data}\" --set data.tokenizer=\"{bpe}\"", 2,
         "trained with 'bytes'"),
        ("--set train.init_from=\"{tmp}/missing\"", 2, "missing"),
        ("--set train.init_from=\"{run}\" --set model.d_model=64", 2, "its model.d_model = 32, this run's is 64"),
        ("--set lora.rank=-1", 2, "lora.rank"),
        ("--set lora.targets=[\"qkv\"]", 2, "qkv"),
        ("--set qat.weight_bits=3", 2, "qat.weight_bits"),
        ("--set train.steps=100000000000000000000000", 2, "train.steps"),
        ("--set lora.rank=64", 2, "lora.rank"),
        ("--set lora.alpha=8.0", 2, "lora.alpha"),
        ("--set parallel.microbatches=2", 2, "parallel.microbatches"),
        ("--set lora.rank=4 --set lora.base=\"nf4\" --set lora.block_size=63", 2, "lora.block_size"),
        ("--set model=3", 2, "--set model=3"),
        ("--set train.init_from=\"{run}\" --set data.dir=\"{bpe_data}\" --set data.tokenizer=\"{bpe}\"", 2,
         "train.init_from"),
        ("--set train.out_dir=\"{locked}\"", 2, "in use by pid"),
        ("--set train.out_dir=\"{ckpt_file_run}\"", 2, "checkpoints"),
        ("--set train.out_dir=\"{edited}\" --set model.d_model=64", 2, "model.d_model: checkpoint 32, config 64 ("),
    ],
    "jaxlm.lora": [
        ("merge {run} --out {tmp}/merged", 2, "not a LoRA run"),
        ("merge {tmp}/missing --out {tmp}/merged2", 2, "missing"),
        ("merge {run} --out {file}", 2, "a_file"),
        ("merge {locked_run} --out {tmp}/merged3", 2, "in use by pid"),
    ],
    "jaxlm.quantize": [
        ("{run} --bits 3", 2, "--bits 3"),
        ("{tmp}/missing", 2, "missing"),
        ("{run} --tokens -1", 2, "--tokens"),
        ("{locked_run}", 2, "in use by pid"),
    ],
    "jaxlm.data": [
        ("", 2, "COMMAND"),
        ("prepare --input {tmp}/missing.txt --out {tmp}/o", 2, "missing.txt"),
        ("prepare --input {text} --out {file}/o", 2, "{file}"),
        ("prepare --input {tmp} --out {tmp}/o", 2, "not a file"),
        ("prepare --input {text} --tokenizer nope --out {tmp}/o", 2, "nope"),
        ("prepare --input {bad_utf8} --tokenizer bytes --out {tmp}/o", 2, "bad_utf8.txt"),
        ("prepare --input {text} --out {tmp}/o --val-fraction 1.5", 2, "--val-fraction"),
        ("prepare --input {text} --out {tmp}/o --workers 0", 2, "--workers"),
        ("train-bpe --input {text} --vocab-size 10 --out {tmp}/b", 2, "vocab_size 10"),
        ("train-bpe --input {text} --vocab-size 300 --out {file}/b", 2, "{file}"),
        ("download nope --out {tmp}/d", 2, "nope"),
        ("train-bpe --input {empty} --vocab-size 300 --out {tmp}/b2", 2, "vocab_size 300"),
        ("train-bpe --input {bad_utf8} --vocab-size 300 --out {tmp}/b3", 2, "bad_utf8.txt"),  # after a progress bar
        ("prepare --input {text} --out {locked}", 2, "in use by pid"),
    ],
    "jaxlm.generate": [
        ("--run {tmp}/missing --prompt x", 2, "missing"),
        ("--run {no_checkpoint} --prompt x", 2, "no_checkpoint"),
        ("--run {corrupt} --prompt x", 2, "corrupt"),
        ("--run {run} --prompt x --max-new-tokens -5", 2, "--max-new-tokens"),
        ("--run {run} --prompt x --top-p 0", 2, "--top-p"),
        ("--run {run} --prompt x --top-k -1", 2, "--top-k"),
        ("--run {run} --prompt x --temperature -1", 2, "--temperature"),
        ("--run {run} --prompt x --num-samples 0", 2, "--num-samples"),
        ("--run {run} --prompt-file {tmp}/missing.txt", 2, "missing.txt"),
        ("--run {run} --prompt x --set model.d_model=64", 2, "model.d_model"),
        ("--run {run} --prompt x --top-k abc", 2, "--top-k"),
        ("--prompt x", 2, "--run"),
    ],
    "jaxlm.bench": [
        ("model --batch 0 --context 16 --set model.d_model=32 --set model.num_heads=2", 2, "--batch"),
        ("model --context 0 --set model.d_model=32 --set model.num_heads=2", 2, "--context"),
        ("model --preset nope", 2, "nope"),
        ("decode --new-tokens x", 2, "--new-tokens"),
    ],
    "parity.check": [
        ("--steps -1", 2, "--steps"),
        ("--set model.d_modle=3", 2, "model.d_modle"),
        ("--seq 1000", 2, "--seq"),
        ("--device banana", 2, "--device"),
    ],
    "jaxlm.memory": [
        ("--batch 0", 2, "--batch"),
        ("--device nope", 2, "nope"),
        ("--memory lots", 2, "--memory"),
        ("--preset nope", 2, "nope"),
        ("--find-max-batch", 2, "--find-max-batch"),
        ("--batch 6 --set train.grad_accum=4", 2, "--batch 6"),
        ("--set model.d_modle=3", 2, "model.d_modle"),
    ],
    "jaxlm.hf": [
        ("", 2, "COMMAND"),
        ("import {tmp}/missing --out {tmp}/hf-import", 2, "missing"),
        ("import {run} --out {tmp}/hf-import2", 2, "config.json"),
        ("export {tmp}/missing --out {tmp}/hf-export", 2, "missing"),
        ("export {run} --out {file}", 2, "a_file"),
        ("export {run} --out {tmp}/hf-export2 --shard-size lots", 2, "--shard-size"),
    ],
    "experiments.run": [
        ("nope_plan", 2, "nope_plan"),
        ("{bad_plan}", 2, "bogus"),
        ("profiling --only zzz --dry-run", 2, "zzz"),
        ("{lock_plan} --runs-dir {locked_runs} --draft", 2, "in use by pid"),
    ],
    "deliverables.report": [("{tmp}/noplan", 2, "noplan")],
    "deliverables.gpu": [
        ("--budget 60", 2, "no GPU here"),
        ("--smoke --out docs/results/gpu", 2, "--out docs/results/gpu"),
    ],
}
COMMANDS = {c.module: c for c in registry.commands()}


def test_the_table_covers_every_library_command_with_30_rows():
    assert sum(map(len, INVOCATIONS.values())) >= 30
    assert {c.module for c in registry.LIBRARY} <= set(INVOCATIONS) <= set(COMMANDS)


def _args(module: str, args: str, files: dict, row: int) -> list[str]:
    import shlex

    args = shlex.split(args.format(**files))
    if module == "jaxlm.train":  # the tiny run's config, each row in its own out_dir unless it names one
        args = sets(tiny_overrides(files["corpus"], f"{files['tmp']}/train-row-{row}")) + args
    return args


@pytest.mark.parametrize("module", [pytest.param(m, marks=needs_of(COMMANDS[m])) for m in INVOCATIONS])
def test_bad_invocations(module, files, tmp_path):
    """Each row: its exit code, exactly one line starting with `error:` that names the culprit,
    no traceback. All rows of one command run in one process (tests/system/cli_harness.py)."""
    rows = INVOCATIONS[module]
    commands = [(module, _args(module, args, files, i)) for i, (args, _, _) in enumerate(rows)]
    extra = {"XLA_FLAGS": xla_devices(8)} if module == "jaxlm.train" else {}
    results = run_rows(commands, tmp_path, tmp_path / "cwd", **extra)
    failures = []
    for (_, args), (_, code, culprit), got in zip(commands, rows, results):
        if why := one_error(got, code, culprit.format(**files)):
            failures.append(f"python -m {module} {' '.join(args)}\n  {why}")
    assert not failures, f"{len(failures)} of {len(rows)} rows:\n" + "\n".join(failures)
