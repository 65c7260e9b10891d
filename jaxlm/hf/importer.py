"""Import a Hugging Face Llama checkpoint as a jaxlm run (`python -m jaxlm.hf import`, docs/hf.md).

    SOURCE (config.json, *.safetensors, tokenizer.json) -> RUN (config.toml, checkpoints/0, tokenizer/)

Everything is checked before anything is allocated or written: config.json's keys and the flags over them,
every safetensors header (names, float dtypes, shapes), the tokenizer's ids against the vocabulary, and what
the import needs in host memory and on disk against what this process may use. Then the tensors are read and
converted one at a time. The run's checkpoint holds the weights alone, float32 (or bfloat16 with
``--dtype bfloat16``), and no optimizer state: it is generated from, quantised, exported and fine-tuned from
(``train.init_from``), never resumed as a training run, and it records no training data.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxlm.core.config import Config, ModelConfig, load_config
from jaxlm.core.errors import CheckpointError, ConfigError, UsageError, WriteFailed
from jaxlm.core.files import atomic_write, write_cause
from jaxlm.core.limits import host_memory
from jaxlm.core.lock import new_directory
from jaxlm.core.typedconfig import blame, toml_value
from jaxlm.core.units import binary
from jaxlm.data.hf_tokenizer import GENERATION_CONFIG, TOKENIZER_EXTRAS, TOKENIZER_JSON, HFTokenizer
from jaxlm.hf import config as hf_config
from jaxlm.hf import files, weights
from jaxlm.hf.convert import flat
from jaxlm.nn import scan
from jaxlm.training.checkpoint import Checkpointer, write_run_files
from jaxlm.training.step import TrainState, build_model, split_model

KEPT_BYTES = {"float32": 4, "bfloat16": 2}  # --dtype: bytes per weight in memory and in the checkpoint
# Host memory of an import: the weights once, orbax's copies while it writes them (bounded by SAVE_GB), the RoPE
# tables with their float64 angles and values while they are built, the largest tensor read, converted and reordered.
SAVE_GB, ROPE_BUILD = 0.5, 6


def imported_config(source: Path, config_path: str | None, overrides: list[str], out: Path) -> Config:
    """The run's config: config.json's model keys, the run's directory and tokenizer, no training data, then
    --config / --set, which may not change what the weights fix (their shapes, the Llama recipe)."""
    where = str(source / "config.json")
    keys = hf_config.model_keys(files.read_object(source / "config.json"), where)
    try:
        want = ModelConfig(**keys)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    sets = [f"model.{k}={toml_value(v)}" for k, v in keys.items()]
    sets += [f"train.out_dir={toml_value(str(out))}", "data.source=[]"]
    if (source / TOKENIZER_JSON).is_file():
        sets.append(f"data.tokenizer={toml_value(str(out / 'tokenizer'))}")
    cfg = load_config(config_path, [*sets, *overrides])
    if cfg.lora.rank or cfg.qat.weight_bits or cfg.qat.activation_bits:
        raise UsageError("lora.* / qat.*: an import writes the checkpoint's own weights; choose LoRA, QLoRA or QAT "
                         f"when fine-tuning from it (python -m jaxlm.train --set train.init_from={out} ...)")
    for key, hf_key in hf_config.FIXED.items():
        ours, theirs = _effective(cfg.model, key), _effective(want, key)
        if ours != theirs:
            what = f"model.{key} = {toml_value(ours)}"
            raise ConfigError(f"{blame(what, config_path, overrides)}: {what}, but the checkpoint's weights have "
                              f"{toml_value(theirs)} ({where}'s {hf_key}); an import keeps the shapes of the weights "
                              "(model.context_length, rope_theta and eps may change)")
    try:  # --set model.norm = "post" and the like: no longer the checkpoint's model
        hf_config.check_exportable(cfg.model)
    except ConfigError as e:
        raise ConfigError(f"{blame(str(e), config_path, overrides)}: {e}") from None
    return cfg


def _effective(m: ModelConfig, key: str):
    return {"num_kv_heads": m.kv_heads, "head_size": m.head_dim}.get(key, getattr(m, key))


def _build(cfg: Config, context_length: int | None = None):
    """A maker of the plain, unscanned model of `cfg` (with another context_length: the weights' shapes do not
    depend on it, the RoPE tables built with the model do)."""
    m = dataclasses.replace(cfg.model, context_length=context_length or cfg.model.context_length)
    plain = Config(model=m, compute=dataclasses.replace(cfg.compute, scan_layers=False))
    return lambda: build_model(plain)


def plan_tensors(source: Path, tensors: dict[str, files.Tensor], cfg: Config) -> dict[str, files.Tensor]:
    """{jaxlm parameter path: its tensor}: every parameter found once, a float tensor of its shape."""
    wanted = {path: v.shape for path, v in flat(split_model(nnx.eval_shape(_build(cfg, 1)))[1]).items()}
    plan = {}
    for name, t in tensors.items():
        if weights.IGNORED.match(name):
            continue
        path = weights.jaxlm_name(name)
        if path is None or path not in wanted:
            raise CheckpointError(f"{t.file}: tensor {name} has no place in jaxlm's model (biases, extra modules); "
                                  "jaxlm cannot represent it")
        if t.dtype not in files.FLOATS:
            raise CheckpointError(f"{t.file}: tensor {name} is {t.dtype}, not a float: a quantised checkpoint (int8, "
                                  "4-bit, fp8 packs) or a damaged one; import the float16 / bfloat16 / float32 "
                                  "original (QLoRA quantises it after import: lora.base = \"nf4\")")
        if t.shape != wanted[path]:
            raise CheckpointError(f"{t.file}: tensor {name} has shape {t.shape}, config.json needs {wanted[path]}")
        plan[path] = t
    missing = sorted(set(wanted) - set(plan))
    if missing:
        raise CheckpointError(f"{source}: no tensor {weights.hf_name(missing[0])} "
                              f"({len(missing)} missing in all)")
    return plan


def check_resources(cfg: Config, plan: dict[str, files.Tensor], dtype: str, source: Path, out: Path,
                    context_key: str) -> None:
    """The import fits the host memory this process may use (cgroup, ulimit -v: jaxlm.core.limits) and the disk
    of --out; else one line naming what it needs, and the key (`context_key`: what set model.context_length) or
    flag that would make it fit."""
    m = cfg.model
    stored = sum(t.size for t in plan.values()) * KEPT_BYTES[dtype]
    rope = m.context_length * m.head_dim * 4 if m.rope else 0  # the cos and sin tables, float32 (H/2 each)
    largest = max(t.nbytes + t.size * (4 + KEPT_BYTES[dtype]) for t in plan.values())
    need, have = stored + min(stored, SAVE_GB * 2**30) + ROPE_BUILD * rope + largest, host_memory()
    if have is not None and need > have[0]:
        what = (f"importing needs about {binary(need)} of host memory ({binary(stored)} of {dtype} weights, "
                f"{binary(rope)} of RoPE tables for {m.context_length:,} positions), but {have[1]} {binary(have[0])}")
        if rope > stored:
            raise ConfigError(f"{context_key}: {what}; import with --set model.context_length=N, the longest context "
                              "you will use")
        halves = dtype == "float32" and any(t.dtype in ("BF16", "F16") for t in plan.values())
        raise ConfigError(f"{source}: {what}; " + ("--dtype bfloat16 keeps the checkpoint's 16-bit weights in half "
                                                  "the memory, or " if halves else "") + "raise the limit")
    probe = out.absolute()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < stored + rope:
        raise UsageError(f"--out {out}: its file system has {binary(free)} free, the imported checkpoint takes "
                         f"{binary(stored + rope)}; free space or choose another --out")


def source_tokenizer(source: Path, hf: dict, vocab_size: int) -> tuple[HFTokenizer | None, dict]:
    """(the checkpoint's tokenizer, None without tokenizer.json; its bos/eos ids from generation_config.json,
    else config.json); a tokenizer with ids past the vocabulary is refused."""
    generation = files.read_object(source / GENERATION_CONFIG) if (source / GENERATION_CONFIG).exists() else \
        {k: hf[k] for k in ("bos_token_id", "eos_token_id") if hf.get(k) is not None}
    path = source / TOKENIZER_JSON
    if not path.is_file():
        return None, generation
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read as UTF-8 text ({e})") from None
    tok = HFTokenizer(text, generation, str(path))
    if tok.vocab_size > vocab_size:
        raise CheckpointError(f"{path}: has token ids up to {tok.vocab_size - 1}, but config.json's vocab_size = "
                              f"{vocab_size} (the embedding's rows): ids {vocab_size} and above would be looked up "
                              "past the embedding; this tokenizer does not belong to these weights")
    return tok, generation


def import_checkpoint(source: Path, out: Path, cfg: Config, origin: str, dtype: str = "float32") -> HFTokenizer | None:
    """Write the run `out` from the Hugging Face directory `source` (named `origin` by the user); returns its
    tokenizer, None when the checkpoint has no tokenizer.json."""
    hf = files.read_object(source / "config.json")
    plan = plan_tensors(source, files.tensors(source), cfg)
    tok, generation = source_tokenizer(source, hf, cfg.model.vocab_size)
    context = cfg.model.context_length
    key = f"{source / 'config.json'}: max_position_embeddings = {context}" if hf.get("max_position_embeddings") == \
        context else f"model.context_length = {context}"
    check_resources(cfg, plan, dtype, source, out, key)
    with new_directory(out, f"--out {out}"):
        _write_run(source, out, cfg, tok, generation, _state(cfg, plan, dtype), origin)
    return tok


def _state(cfg: Config, plan: dict[str, files.Tensor], dtype: str) -> TrainState:
    """The imported model's state at step 0: its weights (in `dtype`), RoPE tables, no optimizer state."""
    build = _build(cfg)
    graphdef, abstract, _ = split_model(nnx.eval_shape(build))
    rest = jax.jit(lambda: split_model(build())[2])()  # RoPE tables and the like; the weights are dead code
    for path, v in flat(abstract).items():  # one tensor at a time: read, reordered for jaxlm's RoPE, converted
        array = files.read(plan[path])
        if weights.is_rotary(path):
            array = weights.to_interleaved(array, cfg.model.head_dim)
        v.set_value(jax.device_put(np.asarray(array, jax.numpy.dtype(dtype))))  # converted on the host
        del array
        gc.collect(1)  # device_put holds the host array in a reference cycle: freed now, not tensors later
    model = nnx.merge(graphdef, abstract, rest)
    scan.relayout(model, cfg.compute.scan_layers)
    _, params, non_trainable = split_model(model)
    return TrainState(jax.numpy.zeros((), np.int32), params, None, non_trainable)


def _write_run(source: Path, out: Path, cfg: Config, tok, generation: dict, state: TrainState, origin: str) -> None:
    """config.toml, tokenizer/ and checkpoints/0 (the weights, no optimizer state); a failed write is one line."""
    try:
        write_run_files(out, cfg, out / "tokenizer")  # config.toml: the tokenizer's files are written next
        _tokenizer_dir(source, out / "tokenizer", tok, generation, cfg.model.vocab_size)
        ckpt = Checkpointer(out, cfg.checkpoint, save_gb=SAVE_GB)
        try:
            ckpt.save(state, {"step": 0, "data_step": 0, "seed": cfg.train.seed, "imported_from": origin})
        finally:
            ckpt.close()
    except (OSError, WriteFailed) as e:
        cause = write_cause(e.__cause__ if isinstance(e, WriteFailed) and e.__cause__ else e)
        raise WriteFailed(f"--out {out}: writing the imported run failed: {cause}; the half-written {out} was "
                          "removed (an import starts over, it does not resume): free space and import again") from None


def _tokenizer_dir(source: Path, dest: Path, tok: HFTokenizer | None, generation: dict, vocab_size: int) -> None:
    """`dest` holding the run's tokenizer (tokenizer.json, generation_config.json, transformers' tokenizer
    files, meta.json); without a tokenizer only generation_config.json, whose bos/eos ids an export keeps."""
    from jaxlm.data.prepare import FORMAT, META, token_dtype

    dest.mkdir(parents=True)
    if tok is None:
        atomic_write(dest / GENERATION_CONFIG, json.dumps(generation, indent=2) + "\n")
        return
    tok.save(dest)
    extras = [name for name in TOKENIZER_EXTRAS if (source / name).is_file()]
    for name in extras:
        shutil.copyfile(source / name, dest / name)
    meta = {"format": FORMAT, "dtype": token_dtype(max(vocab_size, tok.vocab_size)).name, "vocab_size": tok.vocab_size,
            "tokenizer": str(dest), "tokenizer_files": [TOKENIZER_JSON, GENERATION_CONFIG, *extras],
            "tokenizer_sha256": tok.digest(), "special_tokens": tok.special_tokens, "eot_id": tok.eot_id,
            "tokens": {"train": 0, "val": 0}, "imported_from": str(source)}
    atomic_write(dest / META, json.dumps(meta, indent=2) + "\n")
