"""Helpers of the lab's runner tests: the CPU device, a stand-in program for `command` runs, plan files."""

from __future__ import annotations

import textwrap
from pathlib import Path

from experiments.run import Device

CPU = Device("cpu", "cpu", 1)

# A stand-in program for `command` runs: counts its invocations, logs a loss curve, and
# fails / diverges / blocks on request.
FAKE = textwrap.dedent(
    """
    import json, math, os, sys, time
    run_dir, mode = sys.argv[1], sys.argv[2]
    os.makedirs(run_dir, exist_ok=True)
    counter = os.path.join(run_dir, "..", "calls-" + os.path.basename(run_dir))
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(n))
    print("started", flush=True)
    if mode == "block" and os.path.exists(os.path.join(run_dir, "..", "BLOCK")):
        time.sleep(3600)  # until the test interrupts the runner
    loss = 4.0
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        for step in range(1, 4):
            loss = float("nan") if mode == "nan" and step == 3 else loss * 0.8
            f.write(json.dumps({"step": step, "kind": "train", "time": time.time(), "train/loss": loss}) + "\\n")
        row = {"step": 3, "kind": "eval", "time": time.time(), "eval/loss": loss, "eval/perplexity": math.exp(loss)}
        f.write(json.dumps(row) + "\\n")
    if mode == "fail":
        print("something broke: a detail worth keeping", file=sys.stderr)
        sys.exit(3)
    if mode == "nan":
        print("error: loss nan, parameter norm 12.5 at step 3 (grad_norm nan, lr 0.01); stopped without saving",
              file=sys.stderr)
        sys.exit(1)
    """
)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def command_plan(tmp_path: Path, runs: str) -> Path:
    """A plan of `command` runs; FAKE in `runs` stands for the fake program's path."""
    fake = write(tmp_path / "fake.py", FAKE)
    body = f"""
        [defaults]
        kind = "command"
        argv = ["{{python}}", "{fake}", "{{run_dir}}", "ok"]
        """
    return write(tmp_path / "fakeplan.toml", textwrap.dedent(body) + textwrap.dedent(runs).replace("FAKE", str(fake)))

