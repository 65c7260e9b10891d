"""Export a jaxlm run as a Hugging Face Llama checkpoint, and what the import (`importer`) shares with it.

    export: RUN -> DIR (config.json, model.safetensors or shards + index, tokenizer.json, generation_config.json)

The run is read, never written: it takes a reader's lock (none where none can be made, a read-only run).
Parameters are float32 in jaxlm, so a bfloat16 or float32 checkpoint imports exactly, and an export in float32
(the default) imports again bit for bit. A LoRA run exports its merged weights W + (alpha / r) B A, or with
``adapters`` the adapters alone in PEFT's layout (adapter_config.json + adapter_model.safetensors) for the
base model it was tuned from. A write that fails (a full disk, ``ulimit -f``) is one line; the half-written
directory is removed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxlm.core.config import Config
from jaxlm.core.errors import UsageError, WriteFailed
from jaxlm.core.files import read_json, write_cause
from jaxlm.core.lock import DirLock, new_directory
from jaxlm.core.units import binary
from jaxlm.data.hf_tokenizer import GENERATION_CONFIG, TOKENIZER_EXTRAS, TOKENIZER_JSON, HFTokenizer
from jaxlm.hf import config as hf_config
from jaxlm.hf import weights
from jaxlm.nn import lora, scan
from jaxlm.training.checkpoint import find_run_dir, imported_from, restore_for_inference


def flat(state) -> dict[str, nnx.Variable]:
    """{"layers/0/attn/q_proj/weight": variable} of an nnx.State."""
    return {"/".join(map(str, path)): v for path, v in nnx.to_flat_state(state)}


def hf_tensors(model, cfg: Config, dtype) -> dict[str, np.ndarray]:
    """The plain (merged) model's parameters by Hugging Face name, q and k rows in Hugging Face's order."""
    out = {}
    for path, value in flat(nnx.state(model, nnx.Param)).items():
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
    _write_json(out / "adapter_config.json", config)


def _write_json(path: Path, data: dict) -> None:
    try:
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as e:
        raise WriteFailed(f"{path}: cannot be written: {write_cause(e)}") from None


def _tokenizer_files(run_dir: Path, tokenizer, out: Path) -> dict:
    """The run's tokenizer into `out` (a jaxlm BPE converted to tokenizer.json) with transformers' tokenizer
    files; returns the generation config (bos/eos ids), kept by an import without a tokenizer too."""
    from jaxlm.hf.tokenizer import to_tokenizer_json

    src = run_dir / "tokenizer"
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.save(out)
        for name in TOKENIZER_EXTRAS:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
        return tokenizer.generation
    if tokenizer is None:
        generation = read_json(src / GENERATION_CONFIG, default={})
        return generation if isinstance(generation, dict) else {}
    (out / TOKENIZER_JSON).write_text(to_tokenizer_json(tokenizer), encoding="utf-8")
    return {"eos_token_id": tokenizer.eot_id} if tokenizer.eot_id is not None else {}


def export_run(run: str, out: Path, adapters: bool = False, dtype: str = "float32",
               shard_bytes: int = 5 * 10**9) -> list[str]:
    """Write the run (or checkpoint) `run` to `out` in the Hugging Face layout; returns the files written."""
    run_dir, _ = find_run_dir(run)
    with DirLock(run_dir, str(run), shared=True), new_directory(out, f"--out {out}"):
        model, cfg, tokenizer = restore_for_inference(run)
        hf_config.check_exportable(cfg.model)
        adapted = lora.has_adapters(model)
        if adapters and not adapted:
            raise UsageError(f"--adapters: {run} has none (lora.rank = 0); export it without --adapters")
        scan.relayout(model, False)
        out.mkdir(parents=True, exist_ok=True)
        try:
            _write_export(model, cfg, run_dir, tokenizer, out, adapters, dtype, shard_bytes)
        except (OSError, WriteFailed) as e:
            what = str(e) if isinstance(e, WriteFailed) else f"--out {out}: writing the export failed: {write_cause(e)}"
            raise WriteFailed(f"{what}; the half-written {out} was removed: free space and export again") from None
    return sorted(p.name for p in out.iterdir())


def _write_export(model, cfg: Config, run_dir: Path, tokenizer, out: Path, adapters: bool, dtype: str,
                  shard_bytes: int) -> None:
    """The files of `export_run`, after a check that the file system of `out` holds the weights."""
    need = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param))) * jax.numpy.dtype(
        dtype).itemsize
    if shutil.disk_usage(out).free < need:
        raise UsageError(f"--out {out}: its file system has {binary(shutil.disk_usage(out).free)} free, the export "
                         f"takes about {binary(need)}; free space or choose another --out")
    generation = _tokenizer_files(run_dir, tokenizer, out)
    _write_json(out / GENERATION_CONFIG, generation)
    if adapters:
        _adapter_files(model, cfg, run_dir, out)
        return
    if lora.has_adapters(model):
        lora.merge(model)
    weights.write_tensors(hf_tensors(model, cfg, jax.numpy.dtype(dtype)), out, shard_bytes)
    _write_json(out / "config.json", hf_config.hf_config(cfg.model, generation, dtype))
