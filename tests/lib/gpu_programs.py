"""Train steps compiled for an H100, shared by the GPU-compile tests of test_roofline, test_predicted and
test_target: one model, and each program compiled once per test process (a compile here takes 5-10 s).

`compile_step` is jaxlm.predict.compile.compile_step behind a memo keyed by the program's hash (the key of
jaxlm's own compile cache: equal hashes compile to the same plan), so that a test reaching the compiler through
the library (a bench row, the `ops` command) reuses a program another test compiled. The tests that use it share
one xdist group (`needs_programs`), so the memo is filled on one worker."""

import pytest

from jaxlm.core.config import Config, load_config
from jaxlm.predict import compile as gpu
from jaxlm.predict.target import Target, parse_target
from tests.train_helpers import needs

MODEL = ["model.vocab_size=1000", "model.d_model=256", "model.num_layers=2", "model.num_heads=4", "model.d_ff=768"]
CONTEXT, BATCH = 256, 8
# name -> (compute.dtype, compute.attention, compute.remat, compute.scan_layers)
SETTINGS = {"f32": ("float32", "xla", "none", False), "bf16": ("bfloat16", "xla", "none", False),
            "cudnn": ("bfloat16", "cudnn", "none", False), "f32_full": ("float32", "xla", "full", False),
            "cudnn_full": ("bfloat16", "cudnn", "full", False), "cudnn_full_scan": ("bfloat16", "cudnn", "full", True)}

_REAL = gpu.compile_step
_MEMO: dict[str, tuple] = {}


def needs_programs(test):
    """For a test of the shared programs: skipped without XLA's GPU compiler, slow, in the one xdist group."""
    return needs("gpu-compile")(pytest.mark.slow(pytest.mark.xdist_group("gpu_compile-programs")(test)))


def config(name: str, *extra: str) -> Config:
    dtype, attention, remat, scan = SETTINGS[name]
    return load_config(None, [*MODEL, f"model.context_length={CONTEXT}", f"data.batch_size={BATCH}",
                              f'compute.dtype="{dtype}"', f'compute.attention="{attention}"',
                              f'compute.remat="{remat}"', f"compute.scan_layers={str(scan).lower()}", *extra])


def compile_step(cfg: Config, target: Target, mode: str = "train_step", lowered=None):
    """gpu.compile_step, once per lowered program."""
    lowered = lowered if lowered is not None else gpu.lower_step(cfg, target, mode)
    key = gpu.program_hash(lowered, target)
    if key not in _MEMO:
        _MEMO[key] = _REAL(cfg, target, mode, lowered)
    return _MEMO[key]


def program(name: str):
    """(config, compiled program) of SETTINGS[name] for one H100."""
    cfg = config(name)
    return cfg, compile_step(cfg, parse_target("h100-80gb"))[0]
