"""Re-measure the README's headline figures in one sitting, recording the machine and the load around each command:
docs/benchmarks.md, "Measured figures"."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deliverables import common
from experiments.results import read_metrics, summarise_train
from jaxlm import cli
from jaxlm.core import host
from jaxlm.core.files import read_json, write_json


@dataclass(frozen=True)
class Figure:
    name: str
    what: str
    argv: str  # {python} and {out} are filled in; its result: the file after --json, else the run of train.out_dir
    cpu_dependent: bool  # a ratio against PyTorch, which depends on the CPU, not only on its speed


TRAIN = "{python} -m jaxlm.train --set log.progress=false --config experiments/configs"
FIGURES = (
    Figure("quickstart", "the quickstart from a fresh directory: tokenise, 600 steps, evaluations, sample",
           f"{TRAIN}/quickstart.toml --set 'train.out_dir=\"{{out}}/quickstart\"' "
           "--set 'data.dir=\"{out}/quickstart-data\"'", False),
    Figure("shakespeare_char", "nanoGPT's shakespeare_char CPU recipe, end to end",
           f"{TRAIN}/shakespeare_char.toml --set 'train.out_dir=\"{{out}}/shakespeare\"'", False),
    Figure("nanogpt_torch",
           "the same recipe as a plain PyTorch loop (torchref) beside jaxlm's train step, 200 steps each",
           "{python} -m jaxlm.bench nanogpt --steps 200 --framework both --json {out}/nanogpt_torch.json", True),
    Figure("torch_compile_17m", "train step against torch.compile, tinystories-17M, T=256, B=4",
           "{python} -m jaxlm.bench model --preset tinystories-17M --context 256 --batch 4 --mode train_step "
           "--framework both --json {out}/torch_compile_17m.json", True),
    Figure("torch_compile_shakespeare", "train step against torch.compile, shakespeare_char size, T=64, B=12",
           "{python} -m jaxlm.bench model --config experiments/configs/shakespeare_char.toml --batch 12 --mode "
           "train_step --framework both --json {out}/torch_compile_shakespeare.json", True),
    Figure("parity", "JAX against the PyTorch reference over 100 float32 training steps",
           "{python} -m parity.check --steps 100 --json {out}/parity.json", False),
    Figure("decode", "decoding 256 tokens with and without the KV cache, quickstart model",
           "{python} -m jaxlm.bench decode --config experiments/configs/quickstart.toml --json {out}/decode.json",
           False),
    Figure("decode_torch", "decoding 256 tokens with the KV cache against torchref's cached loop, tinystories-17M",
           "{python} -m jaxlm.bench decode --preset tinystories-17M --new-tokens 256 --mode cache --framework both "
           "--json {out}/decode_torch.json", True),
)


def command(fig: Figure, out: Path) -> list[str]:
    return [a.replace("{python}", sys.executable).replace("{out}", str(out)) for a in shlex.split(fig.argv)]


def read_result(fig: Figure, out: Path):
    """What the command reports: the JSON file it wrote, or its training run's final numbers."""
    argv = command(fig, out)
    if "--json" in argv:
        return read_json(argv[argv.index("--json") + 1], default=None)
    run = next(a for a in argv if a.startswith("train.out_dir=")).partition("=")[2].strip('"')
    return summarise_train(read_metrics(Path(run) / "metrics.jsonl"))


def measure(fig: Figure, out: Path) -> dict:
    argv = command(fig, out)
    before = host.describe()["load_avg_1m"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return {"name": fig.name, "what": fig.what, "command": " ".join(argv), "returncode": proc.returncode,
            "wall_s": round(wall, 2), "load_avg_1m": [before, host.describe()["load_avg_1m"]],
            "cpu_dependent": fig.cpu_dependent, "result": read_result(fig, out),
            "stderr_tail": proc.stderr[-2000:] if proc.returncode else ""}


def summary(record: dict) -> str:
    """The few numbers a README row needs, from a figure's result."""
    r = record.get("result")
    if isinstance(r, dict) and "eval_loss" in r:
        return f"val loss {r['eval_loss']:.3f}"
    if isinstance(r, dict) and isinstance(r.get("rows"), list):
        jax_row = next((row for row in r["rows"] if row.get("speed_vs_reference")), None)
        times = {row["framework"]: row.get("step_ms") for row in r["rows"] if row.get("status") == "ok"}
        ref = jax_row["reference"] if jax_row else "torch"
        text = f"jax {times.get('jax', 0):.1f} ms vs {ref} {times.get(ref, 0):.1f} ms"
        return text + (ratio(jax_row, "speed_vs_reference") if jax_row else "")
    if isinstance(r, dict) and "jax_step_time_s" in r:
        return (f"jaxlm {1e3 * r['jax_step_time_s']:.1f} ms vs torch loop {1e3 * r['torch_step_time_s']:.1f} ms per "
                f"step{ratio(r, 'speedup')}")
    if isinstance(r, dict) and "train_loss_max_abs_diff" in r:
        return (f"{'PASS' if r.get('passed') else 'FAIL'}: losses over {r['steps']} steps differ by at most "
                f"{r['train_loss_max_abs_diff']:.1e}, logits {r['logits_max_rel_err']:.1e} relative")
    if isinstance(r, dict) and "speedup" in r.get("jax", {}):
        return (f"jax with the KV cache {r['jax']['cache']['tokens_per_second']:,.0f} vs without "
                f"{r['jax']['no-cache']['tokens_per_second']:,.0f} tokens/s: {r['jax']['speedup']:.1f}x")
    if isinstance(r, dict) and isinstance(r.get("compared"), dict):
        return "; ".join(f"{mode}: jax {r['jax'][mode]['tokens_per_second']:.0f} vs {v['reference']} "
                         f"{r[v['reference']][mode]['tokens_per_second']:.0f} tokens/s"
                         f"{ratio(v, 'speed_vs_reference')}, "
                         f"greedy tokens {'identical' if v['greedy_tokens_identical'] else 'differ'}"
                         for mode, v in r["compared"].items())
    return json.dumps(r)[:160] if r is not None else "no result"


def ratio(record: dict, key: str) -> str:
    """': 1.07x (IQR 0.91-1.04)' (a median of paired rounds, with its interquartile range where there is one), or
    why no ratio is given: one taken while other processes kept the machine busy means little."""
    if record.get("busy"):
        return f": ratio withheld, other processes kept {record['other_cpus']:.1f} CPUs busy"
    iqr = record.get(f"{key}_iqr")
    return f": {record[key]:.2f}x" + (" (IQR {:.2f}-{:.2f})".format(*iqr) if iqr else "")


def table(machine: dict, records: list[dict]) -> str:
    family = f"{machine['cpu_family_model']}; " if machine.get("cpu_family_model") else ""
    lines = [f"Measured on {machine['cpu_model']} ({family}{machine['cpus']} cores; "
             f"{', '.join(machine['vector_extensions'])}):", ""]
    rows = [[r["what"], f"{r['wall_s']:.1f} s", summary(r), f"{r['load_avg_1m'][0]:.1f} / {r['load_avg_1m'][1]:.1f}",
             "yes" if r["cpu_dependent"] else "speed only", f"`{r['command']}`"] for r in records]
    head = ["figure", "wall", "result", "load before/after", "depends on the CPU model", "command"]
    return "\n".join(lines) + "\n" + common.table(head, rows)


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.headline", description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("--out", default="runs/headline", help="where the runs and headline.json go (a fresh one: the "
                   "quickstart figure includes tokenising)")
    p.add_argument("--only", nargs="+", choices=[f.name for f in FIGURES], help="measure these figures only")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing")
    args = p.parse_args(argv)
    out = Path(args.out).absolute()
    figures = [f for f in FIGURES if not args.only or f.name in args.only]
    if args.dry_run:
        print("\n".join(" ".join(command(f, out)) for f in figures))
        return 0
    cli.check_option(not (out / "quickstart").exists() or args.only is not None, "--out", args.out,
                     "already holds a quickstart run: give a fresh directory so the quickstart starts from nothing")
    os.makedirs(out, exist_ok=True)
    machine = host.describe()
    records = []
    for f in figures:
        print(f"[{f.name}] {f.what} ...", flush=True)
        records.append(measure(f, out))
        write_json(out / "headline.json", {"machine": machine, "figures": records})
    print(table(machine, records))
    return 0 if all(r["returncode"] == 0 for r in records) else 1


if __name__ == "__main__":
    sys.exit(cli.run(main))
