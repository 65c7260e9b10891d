"""The curriculum's questions answered: `python -m deliverables.answers --out docs/report/answers.md`.

One section per question id, every number computed when the page is generated: from the library's
analysis modules (`accounting`: parameters, FLOPs, memory, training days; `adamw`: adamwAccounting's
formula and FLOP count), from Python run here (`text`: unicode and tokenizer questions), from the
committed records (`studies`: learning_rate, generate; `measured`: benchmarking_script) and from GPU
records when they exist (`gpu`: memory_profiling, nsys_profile, mixed precision), with the H100 figures
predicted from its compiled program meanwhile (`predicted`, labelled as predictions). A question that needs a
GPU or a corpus this machine lacks says so and gives the command that answers it. The command is
`__main__`; this package exports nothing.
"""

from jaxlm.core import platform

platform.prepare()  # before its modules import JAX: CPU and a quiet start where a CUDA plugin has no GPU
