"""Post-training quantisation (PTQ): convert runs' Linear weights to integers and evaluate them.

    python -m jaxlm.quantize RUN_DIR [RUN_DIR ...] [--bits 8 4] [--tokens N] [--data DIR|CORPUS] [--json FILE]

For each run: the model as trained, then the blocks' Linear weights (attention and
feed-forward) converted to symmetric per-output-channel int8 / int4 (`jaxlm/nn/quant.py`), each
with its validation loss (val.bin of the run's data.dir, or of --data: its data.eval_tokens targets, as in training;
data made with another tokenizer than the run's is refused, and an imported run, which records no data, needs
--data) and its weight bytes (integer
weights at their bit width plus a float32 scale per output channel; embeddings, norms and
the output head stay float32). A QAT run (`qat.*`) keeps the activation quantisation it trained with. Given a
float run and QAT runs, this one table is the float / PTQ / QAT comparison. Each run is read under a shared lock
(jaxlm.core.lock), so no trainer replaces its checkpoints between the rows; a read-only run needs none.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from jaxlm import cli
from jaxlm.core.errors import DataError, UsageError
from jaxlm.core.files import writable_file_problem


def projections(model) -> list:
    """The blocks' linear layers (attention and feed-forward) in either layer layout; not the output head."""
    from flax import nnx

    from jaxlm.nn.layers import Linear
    from jaxlm.nn.quant import QATLinear

    return [m for _, m in nnx.iter_graph(model.layers) if isinstance(m, (Linear, QATLinear))]


def weight_bytes(model, bits: int | None) -> int:
    """Bytes of the model's Params with the block weights at `bits` (+ a float32 scale per row), the rest float32."""
    import jax
    import numpy as np
    from flax import nnx

    total = sum(int(np.prod(p.shape)) * 4 for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if bits:
        for layer in projections(model):
            *layers, O, I = layer.weight.shape  # a leading layers axis when the layers are scanned
            total += int(np.prod(layers)) * (math.ceil(O * I * bits / 8) + 4 * O - 4 * O * I)
    return total


def convert(model, bits: int) -> None:
    """Replace every block weight in place by the values of its `bits`-bit integer version."""
    from jaxlm.nn import quant

    for layer in projections(model):
        layer.weight[...] = quant.dequantize_weight(quant.quantize_weight(layer.weight[...], bits))
        if isinstance(layer, quant.QATLinear):
            layer.weight_bits = None  # the weights are now integers: not quantised a second time


def val_loss(model, cfg, data_dir: Path, eval_tokens: int) -> float:
    """Mean cross-entropy over the first `eval_tokens` validation targets of `data_dir` (`eval_batches`)."""
    import jax
    from flax import nnx

    from jaxlm.data.loader import eval_batches
    from jaxlm.nn.loss import lm_terms
    from jaxlm.training.step import eval_sums

    graphdef, state = nnx.split(model)
    sums = jax.jit(lambda state, x, y, mask: eval_sums(*lm_terms(nnx.merge(graphdef, state), x, y), mask))
    if not (data_dir / "val.bin").is_file():
        raise DataError(f"{data_dir}/val.bin: the validation split to score is missing; prepare the data again")
    loss, tokens = 0.0, 0.0
    for batch in eval_batches(data_dir, "val", cfg.data.batch_size, cfg.model.context_length, eval_tokens):
        out = jax.device_get(sums(state, *batch))
        loss, tokens = loss + float(out["loss_sum"]), tokens + float(out["tokens"])
    return loss / tokens


def eval_data(run: str, cfg, data: str | None, tmp: Path) -> Path:
    """The prepared data `run` is scored on: --data (a prepared directory, or a corpus or text file tokenised into
    `tmp` with the run's tokenizer), else the run's data.dir; refused unless made with the run's tokenizer."""
    from jaxlm.data.prepare import META, prepare, read_meta
    from jaxlm.training.checkpoint import find_run_dir, imported_from

    tok_dir = find_run_dir(run)[0] / "tokenizer"
    ours = read_meta(tok_dir) if (tok_dir / META).is_file() else None
    if data is None and imported_from(run):
        raise UsageError(f"{run}: an imported run records no training data; pass --data DIR (prepared with its "
                         f"tokenizer: python -m jaxlm.data prepare --tokenizer {tok_dir} ...) or --data CORPUS")
    where, d = ("--data", Path(data)) if data is not None else ("data.dir (of its config.toml)", Path(cfg.data.dir))
    if data is not None and not d.is_dir():  # a corpus name or a text file
        if ours is None:
            raise UsageError(f"--data {data}: {run} records no tokenizer to tokenise it with; prepare it with the "
                             "weights' tokenizer (python -m jaxlm.data prepare) and pass --data DIR")
        spec = str(tok_dir) if ours.get("tokenizer_files") else ours["tokenizer"]
        prepare([data], spec, tmp / "data", val_fraction=cfg.data.val_fraction, progress=False)
        return tmp / "data"
    theirs = read_meta(d)
    if ours is None:
        print(f"warning: {run} records no tokenizer (imported without tokenizer.json): {d} is taken to hold the ids "
              "its weights were trained on", file=sys.stderr)
    elif not _same_tokenizer(theirs, ours):
        raise DataError(f"{where} {d}: made with tokenizer {theirs['tokenizer']!r} ({d / META}), but {run}'s "
                        f"tokenizer is {ours['tokenizer']!r} ({tok_dir / META}); its loss would score other ids: pass "
                        "--data with data prepared by the run's tokenizer")
    if theirs["vocab_size"] > cfg.model.vocab_size:
        raise DataError(f"{d / META}: a tokenizer of {theirs['vocab_size']} ids, but {run}'s model.vocab_size = "
                        f"{cfg.model.vocab_size}; it is not the tokenizer these weights were trained with")
    return d


def _same_tokenizer(a: dict, b: dict) -> bool:
    """Two meta.json name one tokenizer: equal digests (of what the tokenizer encodes), else equal names."""
    if a.get("tokenizer_sha256") and b.get("tokenizer_sha256"):
        return a["tokenizer_sha256"] == b["tokenizer_sha256"]
    return a["tokenizer"] == b["tokenizer"]


def quantize_run(run: str, bits_list: list[int], tokens: int | None, data: str | None = None) -> list[dict]:
    """The rows of one run: as trained, then converted to each bit width."""
    import tempfile

    from jaxlm.core.lock import DirLock
    from jaxlm.training.checkpoint import find_run_dir

    with DirLock(find_run_dir(run)[0], run, shared=True), tempfile.TemporaryDirectory(prefix="jaxlm-quantize-") as tmp:
        return _quantize_run(run, bits_list, tokens, data, Path(tmp))


def _quantize_run(run: str, bits_list: list[int], tokens: int | None, data: str | None, tmp: Path) -> list[dict]:
    """`quantize_run` under the run's shared lock."""
    from jaxlm.nn import lora
    from jaxlm.training.checkpoint import restore_for_inference

    model, cfg, _ = restore_for_inference(run)
    if lora.has_adapters(model):
        raise UsageError(f"{run}: a LoRA run; fold its adapters in first (python -m jaxlm.lora merge {run} --out DIR)")
    data_dir = eval_data(run, cfg, data, tmp)
    n = cfg.data.eval_tokens if tokens is None else tokens
    qat = cfg.qat.weight_bits or cfg.qat.activation_bits
    trained = f"qat w{cfg.qat.weight_bits or 32}a{cfg.qat.activation_bits or 32}" if qat else "float32"
    name = Path(run).resolve().name
    rows = [{"run": name, "trained": trained, "weights": f"as trained ({trained})", "bits": None,
             "val_loss": val_loss(model, cfg, data_dir, n), "weight_bytes": weight_bytes(model, None)}]
    for bits in bits_list:
        convert(model, bits)  # from the trained float weights: each width converts the original once
        rows.append({"run": name, "trained": trained, "weights": f"int{bits} (PTQ)", "bits": bits,
                     "val_loss": val_loss(model, cfg, data_dir, n), "weight_bytes": weight_bytes(model, bits)})
        model, _, _ = restore_for_inference(run)
    return rows


def main(argv=None) -> int:
    ap = cli.ArgumentParser(command="jaxlm.quantize", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or checkpoints in them)")
    ap.add_argument("--bits", nargs="+", type=int, default=[8, 4], metavar="B", help="integer widths: 8 and/or 4")
    ap.add_argument("--tokens", type=cli.bounded(int, 0), default=None, metavar="N",
                    help="validation targets per evaluation, 0: all (default: the run's data.eval_tokens)")
    ap.add_argument("--data", metavar="DIR|CORPUS", help="score on this data instead of the run's data.dir (needed "
                    "by an imported run): a prepared directory made with the run's tokenizer, or a corpus name or "
                    "text file, tokenised with it (its last data.val_fraction is scored)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows to FILE as JSON")
    args = ap.parse_args(argv)
    bad = [b for b in args.bits if b not in (4, 8)]
    if bad:
        raise UsageError(f"--bits {bad[0]}: must be 4 or 8")
    problem = writable_file_problem(args.json) if args.json else None
    if problem:  # before the evaluations, not after them
        raise UsageError(f"--json {args.json}: cannot be written: {problem}")
    rows = [row for run in args.runs for row in quantize_run(run, args.bits, args.tokens, args.data)]
    print(f"{'run':<40} {'weights':<28} {'val loss':>9} {'weight bytes':>13}")
    for r in rows:
        print(f"{r['run']:<40} {r['weights']:<28} {r['val_loss']:>9.4f} {r['weight_bytes']:>13,}")
    if args.json:
        from jaxlm.core.files import atomic_write

        atomic_write(Path(args.json), json.dumps(rows, indent=1))
    return 0
