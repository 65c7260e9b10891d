"""One typed configuration tree, loaded from TOML with dotted `--set` overrides.

Every section is a frozen dataclass validated on construction; `load_config`
names the offending key (``optim.lr``) whenever a value is unknown, mistyped or
impossible.  This module imports nothing heavy: torchref shares `ModelConfig`.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names it."""


# --------------------------------------------------------------------------- model

# SPEC section 6: the profiling sizes (d_model, d_ff, num_layers, num_heads).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tinystories-17M": dict(d_model=512, d_ff=1344, num_layers=4, num_heads=16, context_length=256),
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def default_d_ff(d_model: int, ffn: str) -> int:
    """SwiGLU: about 8/3 d_model rounded to a multiple of 64; SiLU: 4 d_model (same parameter count)."""
    if ffn == "silu":
        return 4 * d_model
    return max(64, int(round(8 * d_model / 3 / 64)) * 64)


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer LM of SPEC section 1, shared by jaxlm and torchref.

    The first block of fields fixes the function the model computes (both
    frameworks honour them); the second says how jaxlm executes it.
    """

    vocab_size: int = 10000
    context_length: int = 256
    d_model: int = 512
    num_layers: int = 4
    num_heads: int = 16
    d_ff: int | None = None  # None: default_d_ff(d_model, ffn)
    rope_theta: float = 10000.0
    norm: Literal["pre", "post", "none"] = "pre"
    rope: bool = True
    ffn: Literal["swiglu", "silu"] = "swiglu"
    tie_embeddings: bool = False
    dropout: float = 0.0
    eps: float = 1e-5
    window: int | None = None  # sliding-window attention: each query sees at most `window` previous keys

    attention: Literal["xla", "cudnn", "auto"] = "xla"
    dtype: Literal["float32", "bfloat16"] = "float32"  # compute dtype; parameters stay float32
    remat: Literal["none", "full", "dots_saveable", "offload"] = "none"

    def __post_init__(self):
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", default_d_ff(self.d_model, self.ffn))
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if self.rope and self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head size, got d_model/num_heads = {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.window is not None and self.window < 1:
            raise ConfigError(f"window must be >= 1 or unset, got {self.window}")
        if self.attention == "cudnn" and self.dtype == "float32":
            raise ConfigError("attention='cudnn' needs dtype='bfloat16' (cuDNN has no float32 attention kernel)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """A SPEC section 6 size (`small`, `large`, ...) with vocab 10000 unless overridden."""
        if name not in MODEL_SIZES:
            raise ConfigError(f"unknown model size '{name}'; known: {', '.join(MODEL_SIZES)}")
        return cls(**{**MODEL_SIZES[name], **overrides})


# --------------------------------------------------------------------------- training run


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from. `dir` holds train.bin / val.bin + meta.json (see jaxlm.data)."""

    dir: str = "runs/data/quickstart"
    # Text to tokenise into `dir` when it has no token files yet; "pydoc" is Python's own docs.
    source: list[str] = field(default_factory=lambda: ["pydoc"])
    tokenizer: str = "bytes"  # bytes | gpt2 | path to a directory with vocab.json + merges.txt
    val_fraction: float = 0.1
    batch_size: int = 16  # global batch, in sequences, per optimizer step
    num_workers: int = 0
    prefetch: int = 2

    def __post_init__(self):
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction must be in (0, 1), got {self.val_fraction}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay (SPEC section 2) and global-norm clipping."""

    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    cosine_steps: int | None = None  # T_c; None: train.steps
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping

    def __post_init__(self):
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ConfigError(f"betas must be in [0, 1), got ({self.beta1}, {self.beta2})")
        if self.warmup_steps < 0 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("warmup_steps, grad_clip and weight_decay must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    grad_accum: int = 1  # micro-batches per step; data.batch_size must divide by it
    seed: int = 0
    out_dir: str = "runs/quickstart"
    eval_every: int = 200
    eval_batches: int = 20

    def __post_init__(self):
        if self.steps < 1 or self.grad_accum < 1 or self.eval_every < 1 or self.eval_batches < 1:
            raise ConfigError("steps, grad_accum, eval_every and eval_batches must be >= 1")


@dataclass(frozen=True)
class LogConfig:
    every: int = 10
    tensorboard: bool = True
    profile_steps: list[int] = field(default_factory=list)  # [first, last] step to trace, or empty
    sample_every: int = 0  # 0: only at the end
    sample_tokens: int = 200
    sample_prompt: str = "The "
    sample_temperature: float = 0.8  # 0: greedy
    progress: bool = True
    peak_flops: float | None = None  # per-device peak FLOP/s for MFU where jaxlm.flops has no entry

    def __post_init__(self):
        if self.every < 1 or self.sample_every < 0 or self.sample_tokens < 0 or self.sample_temperature < 0:
            raise ConfigError("every must be >= 1; sample_every, sample_tokens and sample_temperature >= 0")
        if self.profile_steps and (len(self.profile_steps) != 2 or self.profile_steps[0] > self.profile_steps[1]):
            raise ConfigError(f"profile_steps must be [first, last], got {self.profile_steps}")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 500
    keep: int = 2
    keep_best: bool = False  # also keep the checkpoint with the lowest validation loss
    resume: bool = True  # continue from the run directory's latest checkpoint if there is one

    def __post_init__(self):
        if self.every < 1 or self.keep < 1:
            raise ConfigError("checkpoint.every and checkpoint.keep must be >= 1")


@dataclass(frozen=True)
class ParallelConfig:
    """Data parallelism over all devices; `fsdp` also shards parameters and optimizer state."""

    fsdp: bool = False
    distributed: bool = False  # call jax.distributed.initialize() (Slurm / env / the fields below)
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self):
        if self.data.batch_size % self.train.grad_accum:
            raise ConfigError(
                f"data.batch_size ({self.data.batch_size}) must be divisible by train.grad_accum ({self.train.grad_accum})"
            )


# --------------------------------------------------------------------------- loading


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting only where lossless (int -> float)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of settings, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {tp}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return origin(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys by name."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            raise ConfigError(f"unknown key '{prefix}{k}'; valid keys here: {', '.join(names)}")
    kwargs = {k: _coerce(hints[k], v, prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], value); the value is read as TOML, else taken as a string."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{text}': '{part}' is a value, not a section")
        node[path[-1]] = value
    return data


def _deepcopy(d):
    return {k: _deepcopy(v) if isinstance(v, dict) else v for k, v in d.items()}


def load_config(path: str | Path | None = None, overrides: list[str] = (), cls=Config):
    """Read TOML at `path` (or start from defaults), apply `--set` overrides, validate."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    try:
        return from_dict(cls, apply_overrides(data, list(overrides)))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}" if path else str(e)) from None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def dumps_toml(data: dict) -> str:
    """A small TOML writer for config dicts (sections of scalars and lists); None values are omitted."""
    lines: list[str] = []

    def scalar(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as TOML")

    def section(name, d):
        plain = {k: v for k, v in d.items() if not isinstance(v, dict) and v is not None}
        if plain and name:
            lines.append(f"[{name}]")
        lines.extend(f"{k} = {scalar(v)}" for k, v in plain.items())
        if plain:
            lines.append("")
        for k, v in d.items():
            if isinstance(v, dict):
                section(f"{name}.{k}" if name else k, v)

    section("", data)
    return "\n".join(lines)
