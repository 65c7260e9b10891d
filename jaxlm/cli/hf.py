"""Hugging Face Llama-family checkpoints in and out of jaxlm (docs/hf.md; the hf extra).

    python -m jaxlm.hf import SOURCE --out RUN [--dtype bfloat16] [--set model.context_length=2048 ...]
    python -m jaxlm.hf export RUN --out DIR [--adapters] [--dtype bfloat16] [--shard-size 5GB]

SOURCE is a directory in the Hugging Face layout (config.json, *.safetensors, tokenizer.json) or a Hub id
(downloaded with huggingface_hub; needs the network). RUN holds the weights (no optimizer state, no training
data): `python -m jaxlm.generate --run RUN`, `python -m jaxlm.quantize RUN --data DIR`, and fine-tuning into
another directory, `python -m jaxlm.train --config RUN/config.toml --set train.init_from=RUN --set
train.out_dir=NEW --set data.source=[...]` (full, LoRA, QLoRA, QAT) read it. The --set flags change the
imported config (a shorter context_length keeps the RoPE tables small); the model keys that fix the weights'
shapes stay the checkpoint's. DIR loads with transformers.AutoModelForCausalLM.from_pretrained(DIR); a LoRA run
exports merged weights, or its adapters in PEFT's layout with --adapters.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from jaxlm import cli
from jaxlm.cli.memory import parse_size
from jaxlm.core.extras import require


def _out_and_dtype(parser: argparse.ArgumentParser, metavar: str, out_help: str, dtype_help: str) -> None:
    parser.add_argument("--out", required=True, metavar=metavar, help=out_help)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help=dtype_help)


def build_parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(command="jaxlm.hf", description=__doc__, formatter_class=cli.HelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    imp = sub.add_parser("import", help="a Hugging Face checkpoint (directory or Hub id) -> a jaxlm run",
                         formatter_class=cli.HelpFormatter, needs="the 'hf' extra (a Hub id: the network)")
    imp.add_argument("source", metavar="SOURCE", help="a checkpoint directory, or a Hub id (needs the network)")
    _out_and_dtype(imp, "RUN", "the run directory to write (new or empty)",
                   "the weights' dtype in the run's checkpoint: bfloat16 keeps a 16-bit checkpoint in half the memory "
                   "and disk (commands that read the run compute with them in float32)")
    imp.add_argument("--revision", metavar="REV", help="the Hub revision (branch, tag or commit) of a Hub id")
    cli.add_config_args(imp, base="config.json's model over the defaults")
    exp = sub.add_parser("export", help="a jaxlm run -> a Hugging Face checkpoint directory",
                         formatter_class=cli.HelpFormatter, needs="the 'hf' extra")
    exp.add_argument("run", metavar="RUN", help="a run directory (its newest checkpoint) or RUN/checkpoints/STEP")
    _out_and_dtype(exp, "DIR", "the checkpoint directory to write (new or empty)",
                   "the stored weights' dtype (float32 re-imports bit for bit)")
    exp.add_argument("--adapters", action="store_true", help="a LoRA run's adapters alone, in PEFT's layout")
    exp.add_argument("--shard-size", type=parse_size, default="5GB", metavar="SIZE",
                     help="largest safetensors file; above it the weights are sharded with an index")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for module in ("safetensors", "tokenizers"):
        require(module)  # one line naming the hf extra before any work
    from jaxlm.core.host import tune_for_cpu_backend

    tune_for_cpu_backend()
    if args.command == "import":
        return _import(args)
    from jaxlm.hf.convert import export_run

    files = export_run(args.run, Path(args.out), args.adapters, args.dtype, int(args.shard_size))
    print(f"exported {args.run} to {args.out}: {', '.join(files)}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from jaxlm.hf import hub
    from jaxlm.hf.importer import import_checkpoint, imported_config

    out = Path(args.out)
    source = hub.resolve(args.source, args.revision)
    cfg = imported_config(source, args.config, args.overrides, out)
    tok = import_checkpoint(source, out, cfg, args.source, args.dtype)
    m = cfg.model
    print(f"imported {args.source} into {out}: {m.num_layers} layers, d_model {m.d_model}, {m.num_heads} heads "
          f"({m.kv_heads} key/value) of {m.head_dim}, vocabulary {m.vocab_size}")
    if tok is None:
        print(f"warning: {args.source} has no tokenizer.json: the weights are imported, but generation needs "
              f"--tokenizer DIR (python -m jaxlm.generate --run {out} --tokenizer DIR --prompt TEXT)", file=sys.stderr)
    return 0
