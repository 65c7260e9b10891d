"""jaxlm: train, profile and study Transformer language models in JAX / Flax NNX."""

__version__ = "0.1.0"
