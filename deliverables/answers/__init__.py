"""The curriculum's questions answered: `python -m deliverables.answers --out docs/report/answers.md`.

One section per question id, every number computed when the page is generated: `accounting` (parameters, FLOPs,
memory, training days, AdamW) from the library's analysis, `text` (Unicode, tokenizers) from Python and the
tokenizer plan, `studies` and `measured` from the committed records, `gpu` from GPU records or, meanwhile, the
H100's predicted figures (`predicted`). The command is `__main__`; this package exports nothing.
"""

from jaxlm.core import platform

platform.prepare()  # before its modules import JAX: CPU and a quiet start where a CUDA plugin has no GPU
