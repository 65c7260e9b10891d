"""One typed configuration tree, loaded from TOML with presets and dotted `--set` overrides.

Every section is a frozen dataclass validated on construction. Errors name the key and the value
(``optim.lr = -1.0: must be > 0``) and say where the value came from (the TOML file or the `--set` flag).
Every field carries a one-line doc, printed by ``--help-config``. This module declares the tree; the generic
machinery (coercion, overrides, TOML in and out) is `jaxlm/core/typedconfig.py`. Nothing heavy is imported.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from jaxlm.core import typedconfig as tc
from jaxlm.core.errors import ConfigError
from jaxlm.core.presets import PRESETS


def opt(default: Any, doc: str):
    """A dataclass field with a one-line doc (shown by --help-config)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


def _check(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r}: {rule}")


MAX_STEPS = 2**31 - 1  # int32: the train state's step counter (the schedule reads it), token ids and positions
TOO_MANY_STEPS = f"must be at most {MAX_STEPS:,} (the step counter is an int32)"
MAX_SEED = 2**32 - 1  # an unsigned 32-bit seed (NumPy's data order wants it >= 0)
FLOAT32_TINY = 2.0**-126  # float32's smallest normal number: below it a value may be flushed to 0


# --------------------------------------------------------------------------- model and compute


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer LM's architecture (docs/spec.md): what it computes, not how."""

    vocab_size: int = opt(10000, "number of token ids; at least the tokenizer's vocabulary")
    context_length: int = opt(256, "longest sequence the model accepts (RoPE table length)")
    d_model: int = opt(512, "width of the residual stream")
    num_layers: int = opt(4, "number of Transformer blocks")
    num_heads: int = opt(16, "attention (query) heads; must divide d_model unless head_size is set")
    num_kv_heads: int | None = opt(None, "key/value heads, each shared by a group of query heads; unset: num_heads")
    head_size: int | None = opt(None, "width of each attention head; unset: d_model / num_heads")
    d_ff: int | None = opt(None, "feed-forward width; unset: 8/3 d_model rounded to 64 (swiglu), 4 d_model (silu)")
    rope_theta: float = opt(10000.0, "RoPE base frequency")
    rope_scaling: list[float] | None = opt(None, "Llama 3 RoPE scaling: factor, low/high freq factor, original context")
    norm: Literal["pre", "post", "none"] = opt("pre", "RMSNorm placement: pre-norm, post-norm, or no norms (ablation)")
    rope: bool = opt(True, "rotary position embeddings on queries and keys; false = NoPE (ablation)")
    ffn: Literal["swiglu", "silu"] = opt("swiglu", "gated SwiGLU or the ungated SiLU feed-forward (ablation)")
    tie_embeddings: bool = opt(False, "share the output projection with the token embeddings")
    dropout: float = opt(0.0, "dropout on attention probabilities and residual branches, training only")
    eps: float = opt(1e-5, "RMSNorm epsilon")
    window: int | None = opt(
        None, "sliding-window attention: each query sees itself and at most this many previous keys")

    def __post_init__(self):
        if self.d_ff is None:  # SwiGLU: about 8/3 d_model rounded to a multiple of 64; SiLU: 4 d_model (same count)
            swiglu = max(64, int(round(8 * self.d_model / 3 / 64)) * 64)
            object.__setattr__(self, "d_ff", 4 * self.d_model if self.ffn == "silu" else swiglu)
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "num_kv_heads",
                     "head_size"):
            value = getattr(self, name)
            _check(value is None or 0 < value <= MAX_STEPS, name, value, f"must be in 1 ... {MAX_STEPS:,}")
        for name in ("rope_theta", "eps"):
            _check(getattr(self, name) > 0, name, getattr(self, name), "must be > 0")
        _check(self.head_size or self.d_model % self.num_heads == 0, "d_model", self.d_model,
               f"must be divisible by num_heads ({self.num_heads}), or set head_size")
        _check(self.num_heads % self.kv_heads == 0, "num_kv_heads", self.num_kv_heads, f"must divide {self.num_heads}")
        _check(not (self.rope and self.head_dim % 2), "head_size" if self.head_size else "num_heads",
               self.head_size or self.num_heads, f"RoPE needs an even head size, got {self.head_dim}")
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "must be in [0, 1)")
        _check(self.window is None or self.window >= 1, "window", self.window, "must be >= 1 or unset")
        s = self.rope_scaling  # Llama 3.1's [8, 1, 4, 8192]
        _check(s is None or (self.rope and len(s) == 4 and min(s) > 0 and s[2] > s[1]), "rope_scaling", s, "must be 4 "
               "numbers > 0 (factor, low and high frequency factor, original context), high > low, with rope = true")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """The model of preset `name` (`small`, `gpt2-xl`, ...), with field overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name].get("model", {}), **overrides})


@dataclass(frozen=True)
class ComputeConfig:
    """How jaxlm executes the model; none of this changes the function it computes (beyond rounding)."""

    dtype: Literal["float32", "bfloat16"] = opt(
        "float32", "compute dtype of matmuls and activations; parameters, norms, softmax and loss stay float32")
    attention: Literal["xla", "cudnn", "auto"] = opt(
        "xla", "attention kernel: xla (einsums), cudnn (fused, NVIDIA GPU, bfloat16), auto (cudnn where it can run)")
    remat: Literal["none", "full", "dots_saveable", "offload"] = opt(
        "none", "what each block keeps for the backward pass (the rest is recomputed): none everything (with "
        "scan_layers: the matmul outputs, as dots_saveable), full only its input, dots_saveable its matmul "
        "outputs, offload its matmul outputs in host memory; docs/techniques/remat.md")
    scan_layers: bool = opt(
        False, "stack the blocks' parameters on a leading layers axis and run them with lax.scan (compiles once)")
    loss_chunk: int | None = opt(
        None, "tokens per block of the LM head + cross-entropy, so only one block's logits ever exist (each block's "
        "gradients formed as it is computed); 0: whole logits; unset: 1024 from a 32,000-token vocabulary on, else 0 "
        "(the block size is decided in jaxlm.nn.loss.block_positions; docs/techniques/loss-chunking.md)")

    def __post_init__(self):
        _check(not (self.attention == "cudnn" and self.dtype == "float32"), "attention", self.attention,
               "cuDNN attention has no float32 kernel; set compute.dtype = \"bfloat16\" or use \"xla\"")
        _check(self.loss_chunk is None or self.loss_chunk >= 0, "loss_chunk", self.loss_chunk, "must be >= 0 or unset")

    @property
    def remat_policy(self) -> str:
        """The policy applied to each block (`jaxlm/nn/remat.py`) and priced by the memory estimator.

        "none" under scanned layers keeps the matmul outputs and recomputes the elementwise rest, as
        dots_saveable: unrolled, XLA fuses that cheap work into the backward itself, while a scan body
        would store every intermediate per layer (CPU, small preset at batch 4 x 256: 5-8 % slower,
        temporaries 2411 vs 1266 MiB).
        """
        return "dots_saveable" if self.remat == "none" and self.scan_layers else self.remat


# --------------------------------------------------------------------------- training run


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from: `dir` holds train.bin / val.bin + meta.json (see docs/data.md)."""

    dir: str = opt("runs/data/quickstart", "directory of the token files (built from `source` when missing)")
    source: list[str] = opt(["pydoc"], "what to tokenise into `dir`: corpus names (`python -m jaxlm.data list`), "
                            "text files, or \"pydoc\" (Python's bundled docs)")
    val_source: list[str] = opt([], "validation text, as `source` (a corpus NAME/FILE such as "
                                "\"wikitext-2/valid.txt\", or a file); empty: the last val_fraction of the `source` "
                                "tokens")
    tokenizer: str = opt("bytes", "bytes | gpt2 | a directory holding vocab.json + merges.txt | bpe:N (a byte-level "
                         "BPE of N entries trained on `source` when the data is prepared)")
    val_fraction: float = opt(0.1, "share of the text held out for validation (its end) when val_source is empty")
    batch_size: int = opt(16, "global batch in sequences per optimizer step")
    eval_tokens: int = opt(65536, "validation targets scored per evaluation, from the start of val.bin, the same "
                           "whatever the batch size and context length (docs/training.md#evaluation); 0: all")
    num_workers: int = opt(0, "grain worker processes for loading (0: in the main process)")
    prefetch: int = opt(2, "batches prepared ahead of the step")

    def __post_init__(self):
        _check(self.dir.strip() != "", "dir", self.dir, "must name a directory")
        _check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1")
        _check(self.eval_tokens >= 0, "eval_tokens", self.eval_tokens, "must be >= 0 (0: the whole split)")
        _check(0.0 < self.val_fraction < 1.0, "val_fraction", self.val_fraction, "must be in (0, 1)")
        _check(self.num_workers >= 0, "num_workers", self.num_workers, "must be >= 0")
        _check(self.prefetch >= 1, "prefetch", self.prefetch, "must be >= 1")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup then cosine decay (docs/spec.md) and global-norm clipping."""

    lr: float = opt(1e-3, "peak learning rate, reached after warmup")
    min_lr: float = opt(1e-4, "learning rate at the end of the cosine and after it")
    warmup_steps: int = opt(100, "linear warmup from 0 to lr over this many steps")
    cosine_steps: int | None = opt(None, "step at which the cosine reaches min_lr; unset: train.steps")
    beta1: float = opt(0.9, "AdamW first-moment decay")
    beta2: float = opt(0.95, "AdamW second-moment decay")
    eps: float = opt(1e-8, "AdamW epsilon, added to sqrt(v)")
    weight_decay: float = opt(0.1, "decoupled weight decay (times lr)")
    grad_clip: float = opt(1.0, "clip the global gradient L2 norm to this; 0 disables clipping")

    def __post_init__(self):
        _check(self.lr > 0, "lr", self.lr, "must be > 0")
        _check(0 <= self.min_lr <= self.lr, "min_lr", self.min_lr, f"must be in [0, lr = {self.lr}]")
        _check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, "must be >= 0")
        _check(self.cosine_steps is None or self.cosine_steps >= 1, "cosine_steps", self.cosine_steps,
               "must be >= 1 or unset")
        for name in ("warmup_steps", "cosine_steps"):
            _check((getattr(self, name) or 0) <= MAX_STEPS, name, getattr(self, name), TOO_MANY_STEPS)
        for name in ("beta1", "beta2"):
            _check(0 <= getattr(self, name) < 1, name, getattr(self, name), "must be in [0, 1)")
        _check(self.eps >= FLOAT32_TINY, "eps", self.eps, "must be at least 1.2e-38 (float32's smallest normal "
               "number): AdamW divides by sqrt(v) + eps, and a parameter whose gradient is 0 then gives 0/0 = NaN "
               "at the first step; the usual value is 1e-8")
        for name in ("weight_decay", "grad_clip"):
            _check(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")


@dataclass(frozen=True)
class TrainConfig:
    """The run: how long, where it is written, how often it is evaluated."""

    steps: int = opt(1000, "optimizer steps of the whole run")
    grad_accum: int = opt(1, "micro-batches per step; data.batch_size must divide by it")
    seed: int = opt(0, "seeds the initial parameters, the data order and dropout")
    out_dir: str = opt("runs/quickstart", "run directory: config, checkpoints, metrics, TensorBoard events")
    eval_every: int = opt(200, "evaluate on the validation split every this many steps (and at the end)")
    steps_per_call: int = opt(1, "optimizer steps per jitted call (a lax.scan); cut at eval/checkpoint/sample steps")
    init_from: str | None = opt(None, "start from the weights of this run (or RUN/checkpoints/STEP) with a fresh "
                                "optimizer and schedule: fine-tuning")

    def __post_init__(self):
        for name in ("steps", "grad_accum", "eval_every", "steps_per_call"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        _check(self.steps <= MAX_STEPS, "steps", self.steps, TOO_MANY_STEPS)
        _check(0 <= self.seed <= MAX_SEED, "seed", self.seed, f"must be in 0 ... {MAX_SEED:,}")
        _check(self.out_dir.strip() != "", "out_dir", self.out_dir, "must name a directory")
        _check(self.init_from is None or self.init_from.strip() != "", "init_from", self.init_from,
               "must name a run directory or be unset")


@dataclass(frozen=True)
class LogConfig:
    """What the run reports, and when."""

    every: int = opt(10, "log training metrics every this many steps")
    tensorboard: bool = opt(True, "write TensorBoard event files to RUN/tb")
    profile_steps: list[int] = opt([], "[first, last] global steps to trace with the XLA profiler; empty: none")
    sample_every: int = opt(0, "print a text sample every this many steps; 0: only at the end")
    sample_tokens: int = opt(200, "tokens per sample; 0: no samples")
    sample_prompt: str = opt("The ", "prompt of the samples")
    sample_temperature: float = opt(0.8, "sampling temperature; 0: greedy")
    progress: bool = opt(True, "show progress bars (training, and tokenising the data on first use)")
    peak_flops: float | None = opt(None, "per-device peak FLOP/s for MFU where jaxlm.analysis.flops has no entry")

    def __post_init__(self):
        _check(self.every >= 1, "every", self.every, "must be >= 1")
        for name in ("sample_every", "sample_tokens", "sample_temperature"):
            _check(getattr(self, name) >= 0, name, getattr(self, name), "must be >= 0")
        p = self.profile_steps
        _check(not p or (len(p) == 2 and 0 <= p[0] <= p[1]), "profile_steps", p,
               "must be [first, last] with first <= last")


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written and which are kept."""

    every: int = opt(500, "save every this many steps (and at the end, and on SIGTERM)")
    keep: int = opt(2, "keep the newest this many checkpoints")
    keep_best: bool = opt(False, "also keep the checkpoint with the lowest validation loss")
    resume: bool = opt(True, "continue from the run directory's newest checkpoint when there is one")

    def __post_init__(self):
        _check(self.every >= 1, "every", self.every, "must be >= 1")
        _check(self.keep >= 1, "keep", self.keep, "must be >= 1")


@dataclass(frozen=True)
class ParallelConfig:
    """The device mesh (data x fsdp x tensor x pipeline) and multi-process start-up; see docs/parallelism.md."""

    data: int = opt(-1, "data-parallel mesh axis size (-1: the devices the other axes leave)")
    fsdp: int = opt(1, "FSDP mesh axis size: parameters, gradients, optimizer state sharded over it (-1: rest)")
    tensor: int = opt(1, "tensor-parallel mesh axis size: heads and d_ff split over it (Megatron style)")
    pipeline: int = opt(1, "pipeline mesh axis size: the layers split into this many stages")
    microbatches: int = opt(1, "micro-batches per step run through the pipeline (GPipe)")
    distributed: bool = opt(False, "call jax.distributed.initialize() (Slurm, environment, or the fields below)")
    coordinator: str | None = opt(None, "coordinator address host:port for several processes")
    num_processes: int | None = opt(None, "number of processes")
    process_id: int | None = opt(None, "this process's index")

    def __post_init__(self):
        sizes = {k: getattr(self, k) for k in MESH_AXES}
        for k, v in sizes.items():
            _check(v == -1 or v >= 1, f"parallel.{k}", v, "must be >= 1, or -1 for the devices the other axes leave")
        _check(list(sizes.values()).count(-1) <= 1, "parallel", sizes, "at most one mesh axis may be -1")
        _check(self.microbatches >= 1, "parallel.microbatches", self.microbatches, "must be >= 1")
        _check(self.microbatches == 1 or self.pipeline != 1, "parallel.microbatches", self.microbatches,
               "micro-batches feed a pipeline, but parallel.pipeline = 1; set parallel.pipeline > 1, or use "
               "train.grad_accum to split the batch on one stage")


MESH_AXES = ("data", "fsdp", "tensor", "pipeline")


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")


def quant_block(d_in: int, block: int) -> int:
    """The block a quantised base (`jaxlm.nn.quant`) uses on an input width d_in: `block`, or the largest divisor
    of both when d_in is not a multiple of it. Here, the lowest layer, because lora.* is checked against it."""
    return block if d_in % block == 0 else math.gcd(d_in, block)


@dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters W + (alpha / rank) B A on frozen base weights (docs/peft.md); rank 0: off."""

    rank: int = opt(0, "adapter rank r; 0 trains every parameter (no LoRA)")
    alpha: float = opt(16.0, "adapter scale numerator: the update is (alpha / rank) B A")
    targets: list[str] = opt(list(LORA_TARGETS), "the Linear layers of every block that get adapters: "
                             "attention projections and feed-forward matrices")
    dropout: float = opt(0.0, "dropout on the adapters' input, training only")
    base: Literal["float32", "nf4", "int8"] = opt("float32", "storage of the frozen base weights of the targets: "
                                                  "nf4 or int8 with blockwise absmax scales is QLoRA")
    block_size: int = opt(64, "weights per absmax scale of the nf4 / int8 base (along the input axis)")

    def __post_init__(self):
        _check(self.rank >= 0, "rank", self.rank, "must be >= 1 (or 0 to turn LoRA off)")
        _check(self.alpha > 0, "alpha", self.alpha, "must be > 0")
        for t in self.targets:
            _check(t in LORA_TARGETS, "targets", t, f"unknown target; known: {', '.join(LORA_TARGETS)}")
        _check(bool(self.targets) or self.rank == 0, "targets", self.targets, "must name at least one layer")
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "must be in [0, 1)")
        _check(self.block_size >= 1, "block_size", self.block_size, "must be >= 1")
        for f in fields(self)[1:] if self.rank == 0 else ():  # LoRA off: another lora.* value would be ignored
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            _check(getattr(self, f.name) == default, f.name, getattr(self, f.name),
                   "set, but lora.rank = 0 turns LoRA off; set lora.rank >= 1, or leave the lora.* keys unset")

    def check_model(self, m: ModelConfig) -> None:
        """The adapters fit the layers they adapt: a rank of at most min(in, out) of every target, and for
        nf4 an even block (two codes per byte) on every target's input width."""
        q, kv, d, f = m.num_heads * m.head_dim, m.kv_heads * m.head_dim, m.d_model, m.d_ff
        shapes = dict(q_proj=(d, q), k_proj=(d, kv), v_proj=(d, kv), output_proj=(q, d), w1=(d, f), w2=(f, d),
                      w3=(d, f))
        widths = {t: shapes[t] for t in self.targets if self.rank}  # target -> (in, out)
        for t, (d_in, d_out) in widths.items():
            _check(self.rank <= min(d_in, d_out), "lora.rank", self.rank, f"above min(in, out) = {min(d_in, d_out)} of "
                   f"{t} (model.d_model = {m.d_model}, model.d_ff = {m.d_ff}): it adds parameters but no rank")
            block = quant_block(d_in, self.block_size)
            _check(self.base != "nf4" or block % 2 == 0, "lora.block_size", self.block_size, f"nf4 packs two codes "
                   f"per byte, so a block must be even; {t}'s input width {d_in} gives blocks of {block}")


@dataclass(frozen=True)
class QatConfig:
    """Quantisation-aware training: fake-quantised forward, straight-through gradients; unset: off
    (post-training conversion: python -m jaxlm.quantize)."""

    weight_bits: int | None = opt(
        None, "symmetric per-output-channel weight quantisation of the blocks' Linears: 8 or 4")
    activation_bits: int | None = opt(None, "dynamic per-token quantisation of the blocks' Linear inputs: 8")

    def __post_init__(self):
        _check(self.weight_bits in (None, 4, 8), "weight_bits", self.weight_bits, "must be 4, 8 or unset")
        _check(self.activation_bits in (None, 8), "activation_bits", self.activation_bits, "must be 8 or unset")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    qat: QatConfig = field(default_factory=QatConfig)

    def __post_init__(self):
        _check(self.data.batch_size % self.train.grad_accum == 0, "data.batch_size", self.data.batch_size,
               f"must be divisible by train.grad_accum ({self.train.grad_accum})")
        qat = self.qat.weight_bits or self.qat.activation_bits
        _check(not (qat and self.lora.rank), "lora.rank", self.lora.rank,
               "QAT (qat.*) and LoRA in one run are not supported")
        _check(not (self.lora.rank and self.lora.dropout and self.parallel.pipeline != 1), "lora.dropout",
               self.lora.dropout, "the pipeline (parallel.pipeline) runs the adapters without dropout; set it to 0")
        self.lora.check_model(self.model)


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides=(), preset: str | None = None, cls=Config):
    """Defaults < TOML at `path` < preset `preset` < `--set` overrides; validated, errors naming their source."""
    data = tc.read_toml(path) if path is not None else {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"--preset {preset!r}: unknown; known: {', '.join(PRESETS)}")
        data = tc.merge_trees(data, PRESETS[preset])
    overrides = list(overrides)
    for text in overrides:
        try:
            tc.check_override(cls, *tc.parse_override(text))
        except ConfigError as e:
            raise ConfigError(f"--set {text}: {e}") from None
    try:
        return tc.from_dict(cls, tc.apply_overrides(data, overrides))
    except ConfigError as e:
        raise ConfigError(f"{tc.blame(str(e), path, overrides)}: {e}") from None

