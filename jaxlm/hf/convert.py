"""Import a Hugging Face Llama checkpoint as a jaxlm run, and export a run as one.

    import: SOURCE (config.json, *.safetensors, tokenizer.json) -> RUN (config.toml, checkpoints/0, tokenizer/)
    export: RUN -> DIR (config.json, model.safetensors or shards + index, tokenizer.json, generation_config.json)

The imported run is an ordinary one (its resolved config.toml, one orbax checkpoint at step 0 with a fresh
optimizer state, its tokenizer), so generation, `train.init_from`, LoRA / QLoRA / QAT fine-tuning and
quantisation read it without knowing where it came from. Parameters are float32 in jaxlm, so a bfloat16
or float32 checkpoint imports exactly, and an export in float32 (the default) imports again bit for bit.
A LoRA run exports its merged weights W + (alpha / r) B A, or with ``adapters`` the adapters alone in
PEFT's layout (adapter_config.json + adapter_model.safetensors) for the base model it was tuned from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import jax
import numpy as np
from flax import nnx

from jaxlm.core.config import Config, load_config
from jaxlm.core.errors import CheckpointError, UsageError
from jaxlm.core.files import atomic_write, read_json, writable_dir_problem
from jaxlm.core.lock import DirLock
from jaxlm.core.typedconfig import toml_value
from jaxlm.data.hf_tokenizer import GENERATION_CONFIG, TOKENIZER_JSON, HFTokenizer, is_hf_tokenizer
from jaxlm.hf import config as hf_config
from jaxlm.hf import weights
from jaxlm.nn import lora, scan
from jaxlm.training.checkpoint import Checkpointer, find_run_dir, restore_for_inference, saved_steps, write_run_files
from jaxlm.training.optim import make_optimizer
from jaxlm.training.step import TrainState, build_model, split_model

TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")  # carried along for transformers' loader


@contextlib.contextmanager
def _writing(out: Path) -> Iterator[None]:
    """`out` (new or empty) locked while it is written, and removed again when writing fails half-way."""
    problem = writable_dir_problem(out)
    if problem or (out.is_dir() and any(out.iterdir())):
        raise UsageError(f"--out {out}: {problem or 'exists and is not empty'}; choose a new directory")
    with DirLock(out, f"--out {out}"):
        try:
            yield
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise


def _flat(state) -> dict[str, nnx.Variable]:
    """{"layers/0/attn/q_proj/weight": variable} of an nnx.State."""
    return {"/".join(map(str, path)): v for path, v in nnx.to_flat_state(state)}


# --------------------------------------------------------------------------- import


def imported_config(source: Path, config_path: str | None, overrides: list[str], out: Path) -> Config:
    """The run's config: config.json's model keys, the run's directory and tokenizer, then --config / --set."""
    hf = json.loads((source / "config.json").read_text())
    keys = hf_config.model_keys(hf, str(source / "config.json"))
    sets = [f"model.{k}={toml_value(v)}" for k, v in keys.items()]
    sets += [f"train.out_dir={toml_value(str(out))}"]
    if is_hf_tokenizer(source):
        sets.append(f"data.tokenizer={toml_value(str(out / 'tokenizer'))}")
    cfg = load_config(config_path, [*sets, *overrides])
    if cfg.lora.rank or cfg.qat.weight_bits or cfg.qat.activation_bits:
        raise UsageError("lora.* / qat.*: an import writes the checkpoint's own weights; choose LoRA, QLoRA or QAT "
                         f"when fine-tuning from it (python -m jaxlm.train --set train.init_from={out} ...)")
    return cfg


def _model_from(cfg: Config, tensors: dict[str, np.ndarray], where: str):
    """The plain model of `cfg` holding `tensors` (Hugging Face names): every parameter found once, with its
    shape; q and k rows reordered for jaxlm's RoPE. The random initial weights are never materialised."""
    plain = Config(model=cfg.model, compute=dataclasses.replace(cfg.compute, scan_layers=False))
    build = lambda: build_model(plain)  # noqa: E731
    graphdef, abstract, _ = split_model(nnx.eval_shape(build))
    rest = jax.jit(lambda: split_model(build())[2])()  # RoPE tables and the like; the weights are dead code
    wanted = {path: v.shape for path, v in _flat(abstract).items()}
    values = {}
    for name, array in tensors.items():
        path = weights.jaxlm_name(name)
        if path is None or path not in wanted:
            raise CheckpointError(f"{where}: tensor {name} has no place in jaxlm's model (biases, extra modules); "
                                  "jaxlm cannot represent it")
        if array.shape != wanted[path]:
            raise CheckpointError(f"{where}: tensor {name} has shape {array.shape}, config.json's model needs "
                                  f"{wanted[path]}")
        values[path] = weights.to_interleaved(array, cfg.model.head_dim) if weights.is_rotary(path) else array
    missing = sorted(set(wanted) - set(values))
    if missing:
        raise CheckpointError(f"{where}: no tensor {weights.hf_name(missing[0])} ({len(missing)} missing in all)")
    for path, v in _flat(abstract).items():
        v.set_value(jax.numpy.asarray(values[path]))
    model = nnx.merge(graphdef, abstract, rest)
    scan.relayout(model, cfg.compute.scan_layers)
    return model


def _tokenizer_dir(source: Path, hf: dict, dest: Path, final: Path, vocab_size: int) -> HFTokenizer | None:
    """`dest` holding the run's tokenizer (tokenizer.json, generation_config.json, meta.json; it will live in
    `final`) when the checkpoint has a tokenizer.json; bos/eos ids from its generation_config.json, else
    config.json."""
    from jaxlm.data.prepare import FORMAT, META, token_dtype

    if not is_hf_tokenizer(source):
        return None
    generation = read_json(source / GENERATION_CONFIG, default=None) or \
        {k: hf[k] for k in ("bos_token_id", "eos_token_id") if hf.get(k) is not None}
    tok = HFTokenizer((source / TOKENIZER_JSON).read_text(encoding="utf-8"), generation, str(final))
    dest.mkdir(parents=True)
    tok.save(dest)
    extras = [name for name in TOKENIZER_EXTRAS if (source / name).is_file()]
    for name in extras:
        shutil.copyfile(source / name, dest / name)
    meta = {"format": FORMAT, "dtype": token_dtype(max(vocab_size, tok.vocab_size)).name, "vocab_size": tok.vocab_size,
            "tokenizer": str(final), "tokenizer_files": [TOKENIZER_JSON, GENERATION_CONFIG, *extras],
            "tokenizer_sha256": tok.digest(), "special_tokens": tok.special_tokens, "eot_id": tok.eot_id,
            "tokens": {"train": 0, "val": 0}, "imported_from": str(source)}
    atomic_write(dest / META, json.dumps(meta, indent=2) + "\n")
    return tok


def import_checkpoint(source: Path, out: Path, cfg: Config, origin: str) -> HFTokenizer | None:
    """Write the run `out` from the Hugging Face directory `source` (named `origin` by the user); returns its
    tokenizer, None when the checkpoint has no tokenizer.json."""
    hf = json.loads((source / "config.json").read_text())
    with _writing(out):
        model = _model_from(cfg, weights.read_tensors(source), str(source))
        with tempfile.TemporaryDirectory() as staging:
            tok = _tokenizer_dir(source, hf, Path(staging) / "tokenizer", out / "tokenizer", cfg.model.vocab_size)
            write_run_files(out, cfg, Path(staging) / "tokenizer")
        tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
        ckpt = Checkpointer(out, cfg.checkpoint)
        try:
            ckpt.save(TrainState.create(model, tx), {"step": 0, "data_step": 0, "seed": cfg.train.seed,
                                                     "imported_from": origin})
        finally:
            ckpt.close()
    return tok


# --------------------------------------------------------------------------- export


def hf_tensors(model, cfg: Config, dtype) -> dict[str, np.ndarray]:
    """The plain (merged) model's parameters by Hugging Face name, q and k rows in Hugging Face's order."""
    out = {}
    for path, value in _flat(nnx.state(model, nnx.Param)).items():
        array = np.asarray(value.get_value(), np.float32)
        if weights.is_rotary(path):
            array = weights.to_halves(array, cfg.model.head_dim)
        out[weights.hf_name(path)] = array.astype(dtype)
    return out


def _adapter_files(model, cfg: Config, run_dir: Path, out: Path) -> None:
    """adapter_config.json + adapter_model.safetensors in PEFT's layout: lora_A (r, in), lora_B (out, r), B's
    rows of q and k reordered as the weights are; the scale alpha / r is PEFT's lora_alpha / r."""
    tensors = {}
    for path, layer in nnx.iter_graph(model):
        if isinstance(layer, lora.LoRALinear):
            name = weights.hf_name("/".join(map(str, path)) + "/weight")[:-len(".weight")]
            b = np.asarray(layer.lora_b[...], np.float32)
            if weights.is_rotary("/".join(map(str, path)) + "/"):
                b = weights.to_halves(b, cfg.model.head_dim)
            tensors[f"base_model.model.{name}.lora_A.weight"] = np.asarray(layer.lora_a[...], np.float32)
            tensors[f"base_model.model.{name}.lora_B.weight"] = b
    weights.write_tensors(tensors, out, 2**62, prefix="adapter_model")
    base = imported_from(cfg.train.init_from) if cfg.train.init_from else None
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.lora.rank, "lora_alpha": cfg.lora.alpha,
              "lora_dropout": cfg.lora.dropout, "target_modules": sorted(weights.MODULES[t] for t in cfg.lora.targets),
              "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
              "base_model_name_or_path": base or cfg.train.init_from or str(run_dir)}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def imported_from(run: str) -> str | None:
    """The Hugging Face source a run (or the run it was initialised from) was imported from, when recorded."""
    run_dir, _ = find_run_dir(run)
    steps = saved_steps(run_dir)
    meta = read_json(run_dir / "checkpoints" / str(steps[0]) / "meta" / "metadata", default={}) if steps else {}
    return meta.get("imported_from") if isinstance(meta, dict) else None


def _tokenizer_files(run_dir: Path, tokenizer, out: Path) -> dict:
    """The run's tokenizer into `out` (a jaxlm BPE converted to tokenizer.json); returns the generation config."""
    from jaxlm.hf.tokenizer import to_tokenizer_json

    src = run_dir / "tokenizer"
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.save(out)
        for name in TOKENIZER_EXTRAS:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
        return tokenizer.generation
    if tokenizer is None:
        return {}
    (out / TOKENIZER_JSON).write_text(to_tokenizer_json(tokenizer), encoding="utf-8")
    generation = {"eos_token_id": tokenizer.eot_id} if tokenizer.eot_id is not None else {}
    (out / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    return generation


def export_run(run: str, out: Path, adapters: bool = False, dtype: str = "float32",
               shard_bytes: int = 5 * 10**9) -> list[str]:
    """Write the run (or checkpoint) `run` to `out` in the Hugging Face layout; returns the files written."""
    run_dir, _ = find_run_dir(run)
    with DirLock(run_dir, str(run)), _writing(out):
        model, cfg, tokenizer = restore_for_inference(run)
        hf_config.check_exportable(cfg.model)
        adapted = lora.has_adapters(model)
        if adapters and not adapted:
            raise UsageError(f"--adapters: {run} has none (lora.rank = 0); export it without --adapters")
        scan.relayout(model, False)
        out.mkdir(parents=True, exist_ok=True)
        generation = _tokenizer_files(run_dir, tokenizer, out)
        if adapters:
            _adapter_files(model, cfg, run_dir, out)
            return sorted(p.name for p in out.iterdir())
        if adapted:
            lora.merge(model)
        np_dtype = jax.numpy.dtype(dtype)
        weights.write_tensors(hf_tensors(model, cfg, np_dtype), out, shard_bytes)
        config = hf_config.hf_config(cfg.model, generation, dtype)
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if not (out / GENERATION_CONFIG).is_file():
            (out / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
    return sorted(p.name for p in out.iterdir())
