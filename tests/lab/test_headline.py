"""deliverables.headline: the README's headline figures, re-measured in one sitting (commands and table only here)."""

from deliverables import headline
from jaxlm import cli


def test_dry_run_lists_every_figure_and_runs_nothing(tmp_path, capsys):
    assert cli.run(headline.main, ["--dry-run", "--out", str(tmp_path / "h")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(headline.FIGURES) and not (tmp_path / "h").exists()
    assert "-m jaxlm.train --set log.progress=false --config experiments/configs/quickstart.toml" in lines[0]
    assert f'train.out_dir="{tmp_path}/h/quickstart"' in lines[0] and "--framework both" in lines[3]


def test_results_are_read_from_what_each_command_writes(tmp_path):
    (tmp_path / "quickstart").mkdir()
    (tmp_path / "quickstart" / "metrics.jsonl").write_text('{"step": 600, "kind": "eval", "eval/loss": 1.2981}\n')
    (tmp_path / "nanogpt_torch.json").write_text('{"train_s": 69.4}')
    train, nanogpt = headline.FIGURES[0], headline.FIGURES[2]
    assert headline.read_result(train, tmp_path)["eval_loss"] == 1.2981
    assert headline.read_result(nanogpt, tmp_path) == {"train_s": 69.4}
    rows = {"rows": [{"framework": "jax", "status": "ok", "step_ms": 25.9, "speed_vs_reference": 1.066,
                      "reference": "torch"}, {"framework": "torch", "status": "ok", "step_ms": 27.6}]}
    record = {"what": "step", "wall_s": 12.34, "result": rows, "load_avg_1m": [0.1, 0.4], "cpu_dependent": True,
              "command": "python -m jaxlm.bench model"}
    assert headline.summary(record) == "jax 25.9 ms vs torch 27.6 ms: 1.07x"
    machine = {"cpu_model": "Test CPU", "cpu_family_model": "family 6 model 207", "cpus": 2,
               "vector_extensions": ["avx2"]}
    assert ("| step | 12.3 s | jax 25.9 ms vs torch 27.6 ms: 1.07x | 0.1 / 0.4 | yes | `python -m jaxlm.bench model` |"
            in headline.table(machine, [record]))
    assert headline.table(machine, [record]).startswith("Measured on Test CPU (family 6 model 207; 2 cores; avx2):")
    # interleaved rows carry the interquartile range of their paired rounds; decoding its tokens/s and tokens
    rows["rows"][0]["speed_vs_reference_iqr"] = [0.91, 1.04]
    assert headline.summary(record) == "jax 25.9 ms vs torch 27.6 ms: 1.07x (IQR 0.91-1.04)"
    rows["rows"][0].update(busy=True, other_cpus=1.53)  # timed while other processes took the CPUs: no ratio
    assert headline.summary(record) == ("jax 25.9 ms vs torch 27.6 ms: ratio withheld, other processes kept 1.5 "
                                        "CPUs busy")
    decode = {"jax": {"cache": {"tokens_per_second": 325.5}}, "torch": {"cache": {"tokens_per_second": 149.8}},
              "compared": {"cache": {"speed_vs_reference": 2.173, "reference": "torch",
                                     "greedy_tokens_identical": True}}}
    assert headline.summary({"result": decode}) == ("cache: jax 326 vs torch 150 tokens/s: 2.17x, greedy tokens "
                                                    "identical")
    cache = {"jax": {"cache": {"tokens_per_second": 3880.1}, "no-cache": {"tokens_per_second": 129.9},
                     "speedup": 29.87}}
    assert headline.summary({"result": cache}) == "jax with the KV cache 3,880 vs without 130 tokens/s: 29.9x"
    parity = {"passed": True, "steps": 100, "train_loss_max_abs_diff": 2.38e-6, "logits_max_rel_err": 4.05e-7}
    assert headline.summary({"result": parity}) == ("PASS: losses over 100 steps differ by at most 2.4e-06, logits "
                                                    "4.0e-07 relative")
    loop = {"jax_step_time_s": 0.0448, "torch_step_time_s": 0.0677, "speedup": 1.506, "speedup_iqr": [1.4, 1.6]}
    assert headline.summary({"result": loop}) == "jaxlm 44.8 ms vs torch loop 67.7 ms per step: 1.51x (IQR 1.40-1.60)"
