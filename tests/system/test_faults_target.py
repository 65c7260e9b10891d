"""Compiling for a GPU (`--target`) when things go wrong: a shape the compiler cannot tile, a signal during a
sweep of compiles, options that contradict the target, a malformed target file (docs/errors.md)."""

import json
import signal
from pathlib import Path

import pytest

from jaxlm import cli
from jaxlm.cli import memory as memory_cli
from jaxlm.core.config import load_config
from jaxlm.core.errors import UsageError
from jaxlm.predict import compile as gpu
from jaxlm.predict import target as gpu_target
from tests.system.fault_helpers import sets, signalled
from tests.train_helpers import needs_compiler

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.num_layers=1", "model.d_model=64", "model.num_heads=2", "model.d_ff=128", "model.vocab_size=256"]


def _one_error_line(capsys_or_capfd) -> str:
    err = capsys_or_capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# --------------------------------------------------------------------------- a shape without a Triton tiling


@needs_compiler
def test_a_context_that_is_not_a_power_of_two_compiles(capsys):
    """At context 1000, batch 3 and d_model 768 a backward matmul is bf16[3000,768]: the untuned Triton GEMM
    tiler finds no tile sizes for it, and the step compiles with its matmuls as cuBLAS calls instead."""
    model = ["model.num_layers=1", "model.d_model=768", "model.num_heads=12", "model.d_ff=3072", "model.vocab_size=256"]
    argv = ["--target", "h100-80gb", *sets(model), "--context", "1000", "--batch", "3", "--dtype", "bfloat16"]
    assert cli.run(memory_cli.main, [*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["compiler_options"] == {"xla_gpu_enable_triton_gemm": False}
    assert r["matmuls"] > 0 and r["temp_bytes"] > 0 and r["argument_bytes"] > r["alias_bytes"] > 0


def test_a_shape_the_compiler_cannot_tile_at_all_stops_in_one_line_naming_it(monkeypatch):
    error = ("INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot_general.11 = bf16[3000,768]{1,0} "
             "dot(%bitcast.245, %parameter_1.20), lhs_contracting_dims={1}")
    tried = []

    class Lowered:
        def compile(self, compiler_options=None):
            tried.append(compiler_options)
            raise RuntimeError(error)

    monkeypatch.setattr(gpu, "devices", lambda target: ())
    cfg = load_config(None, [*TINY, "model.context_length=1000", "data.batch_size=3"])
    with pytest.raises(UsageError, match=r"Triton tiling for bf16\[3000,768\] at batch 3, context 1000.*power of two"):
        gpu.compile_step(cfg, gpu_target.parse_target("h100-80gb"), lowered=Lowered())
    assert tried == [None, gpu.TRITON_OFF]


# --------------------------------------------------------------------------- signals during a sweep of compiles


def _sweep_stopped_by(sig: int, out: Path) -> tuple[int, str, str]:
    """A sweep of four compiles, signalled once the first row is printed: exit code, stdout, stderr."""
    return signalled(["-m", "jaxlm.bench", "model", "--target", "h100-80gb", *sets(TINY), "--context", "16", "32",
                      "64", "128", "--batch", "2", "--mode", "train_step", "--json", str(out)], "[compiled]", sig)


@needs_compiler
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.extended), signal.SIGINT],
                         ids=["SIGTERM", "SIGINT"])  # both set the same stop flag; Ctrl-C's path is the longer one
def test_a_signal_during_a_compile_sweep_keeps_the_rows_compiled(sig, tmp_path):
    code, out, err = _sweep_stopped_by(sig, tmp_path / "rows.json")
    last = err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in err, err
    kept = json.loads((tmp_path / "rows.json").read_text())["rows"]
    assert 1 <= len(kept) < 4 and all(r["status"] == "ok" for r in kept)
    assert last == (f"interrupted: {signal.Signals(sig).name}: stopped after {len(kept)} of 4 compiled rows; kept in "
                    f"the table above and {tmp_path / 'rows.json'}")
    assert out.count("train_step") >= len(kept) and "total GiB" in out  # the table of what was compiled


@needs_compiler
def test_a_signal_during_an_ops_target_compile_is_one_line(tmp_path):
    """The compile cannot be interrupted: SIGTERM waits for it, then stops in one line, writing nothing."""
    out = tmp_path / "kernels.json"
    code, _, err = signalled(["-m", "jaxlm.bench", "ops", "--target", "h100-80gb", *sets(TINY), "--context", "64",
                              "--batch", "2", "--json", str(out)], "[compiling]", signal.SIGTERM)
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("interrupted: SIGTERM during the compile for h100-80gb: stopped; nothing "
                                            "written")
    assert not out.exists()


# --------------------------------------------------------------------------- rows that cannot be; the compiler's log


@needs_compiler
def test_a_sweep_whose_every_row_is_invalid_exits_nonzero(capsys):
    from jaxlm.bench.commands import main

    argv = ["model", "--target", "h100-80gb:2", "--config", str(ROOT / "experiments/configs/quickstart.toml"),
            "--context", "128", "--batch", "3"]
    assert cli.run(main, argv) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: no row compiled: all 1 are invalid (first: data.batch_size = 3: ")


@needs_compiler
def test_the_gpu_compilers_log_stays_off_the_terminal(tmp_path, capfd):
    """A step larger than the GPU: XLA's C++ logs "... exceeds the base limit ... This indicates an error in the
    calculation!" while compiling it; the row says it does not fit instead."""
    small = tmp_path / "small.toml"  # a 64 MiB GPU: the 25M-parameter model's state alone is 400 MB
    small.write_text(SMALL_GPU)
    model = ["model.vocab_size=50257", "model.d_model=256", "model.num_layers=1", "model.num_heads=4",
             "model.d_ff=512"]
    assert cli.run(memory_cli.main, ["--target-config", str(small), *sets(model), "--context", "64", "--batch",
                                     "2"]) == 0
    out, err = capfd.readouterr()
    assert err == "", err  # fd 2: where the compiler's C++ log would show
    assert "no predicted time: does not fit (0.42 GiB of 0.05 GiB usable)" in out


SMALL_GPU = """description = "Small GPU"
memory_bytes = 67108864
bandwidth = 1.0e12
peak_bfloat16 = 100e12
sms = 40
compute_capability = [8, 0]
clock_ghz = 1.5
l2_bytes = 8388608
shared_per_sm = 167936
shared_per_block_optin = 166912
threads_per_sm = 2048
"""


# --------------------------------------------------------------------------- options that contradict the target


@pytest.mark.parametrize("given", [["--memory", "24GiB"], ["--device", "l4"]])
def test_target_with_another_memory_is_refused_in_one_line(given, capsys):
    assert cli.run(memory_cli.main, ["--target", "h100-80gb", *given]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {given[0]} ")
    assert "with --target h100-80gb the memory is the target's (84.9 GB)" in line


@needs_compiler
def test_a_malformed_target_config_is_one_line_without_the_compilers_log(tmp_path, capfd):
    bad = tmp_path / "mygpu.txtpb"
    bad.write_text("device_memory_size: 1000 cuda_compute_capability core_count: x {{{\n")
    assert cli.run(memory_cli.main, ["--target-config", str(bad), *sets(TINY)]) == 2
    line = _one_error_line(capfd)  # fd 2: the C++ log line would show here
    assert line.startswith(f"error: --target-config {bad}: not a GpuTargetConfigProto in text form (1:")
    assert "JAX_PLATFORMS" not in line


def test_the_cpu_advice_is_given_only_where_it_helps(monkeypatch):
    target = gpu_target.parse_target("h100-80gb")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert "JAX_PLATFORMS" not in gpu_target.refusal(target, RuntimeError("no CUDA backend"), [])
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert gpu_target.refusal(target, RuntimeError("no CUDA backend"), []).endswith("run with JAX_PLATFORMS=cpu")
