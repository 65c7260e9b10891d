"""The deliverables' commands, registered with jaxlm's command list (`python -m jaxlm`; entry point group
jaxlm.cli.registry)."""

from jaxlm.cli.registry import CORE, Command

COMMANDS = (
    Command("deliverables.report", "a plan's report, one training run's page, or a benchmark file's figures",
            needs=f"{CORE} (figures: the 'plots' extra; --compile: the 'gpu-compile' extra)"),
    Command("deliverables.written.figures", "the written report's numbered figures, from the committed records",
            needs="the 'plots' extra"),
    Command("deliverables.written.claims", "every number the written report states, computed from its source"),
    Command("deliverables.answers", "every question of the curriculum with its answer (docs/report/answers.md)"),
    Command("deliverables.headline", "re-measure the README's headline figures in one sitting",
            needs="the 'torch' extra (its PyTorch figures)"),
    Command("deliverables.compiled_memory", "the curriculum's GPU memory questions, compiled by XLA's GPU compiler "
            "on any machine", needs="the 'gpu-compile' extra"),
    Command("deliverables.compiled_time", "the curriculum's GPU time questions, predicted from XLA's GPU program "
            "on any machine", needs="the 'gpu-compile' extra"),
    Command("deliverables.memory_profile", "memory_profiling for `large`: peak table, largest buffers, live bytes "
            "over the compiled schedule", needs="the 'gpu-compile' and 'plots' extras"),
    Command("deliverables.predicted_anchors", "published GPU measurements beside jaxlm's prediction of the same "
            "configurations (docs/benchmarks.md)", needs="the 'gpu-compile' extra"),
    Command("deliverables.memory_validation", "the memory estimator against the compilers' plans of the same "
            "train steps", needs=f"{CORE} (--target: the 'gpu-compile' extra)"),
    Command("deliverables.gpu", "the GPU campaign: every GPU figure the curriculum asks for, within a time budget",
            needs=f"an NVIDIA GPU and JAX's CUDA build (the 'cuda12' or 'cuda13' extra); --dry-run and --smoke: "
                  f"{CORE}"),
    Command("deliverables.gpu.offline", "the GPU campaign on an offline GPU machine as it is: install, check, measure",
            needs=f"an NVIDIA GPU machine with JAX's CUDA build and the wheels of .whl/; --dry-run and --smoke: "
                  f"{CORE}"),
    Command("deliverables.gpu.merge", "take an offline GPU run's results into the committed GPU report"),
    Command("deliverables.gpu.carry", "the wheels and the corpus an offline GPU run carries: download or check them",
            needs=f"{CORE} (download: the network)"),
    Command("deliverables.hf_random", "a random-weight Hugging Face checkpoint of SmolLM2-135M's shape, nothing "
            "downloaded", needs="the 'test' extra (transformers) and GPT-2's vocabulary"),
    Command("deliverables.tokenizer_study", "the CS336 tokenizer experiments, one measurement per call"),
)

EXTRAS = {"matplotlib": "plots"}  # the report's figures -> the pyproject extra (jaxlm.core.extras)
