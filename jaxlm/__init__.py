"""jaxlm: train, profile and study Transformer language models in JAX / Flax NNX."""

__version__ = "0.1.0"

from jaxlm.core import stop as _stop  # noqa: E402

_stop.defer_interrupts()  # a command's Ctrl-C from its first import on (nothing in a library import)
