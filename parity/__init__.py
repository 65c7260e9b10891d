"""Weight conversion between torchref and jaxlm, and numerical parity checks."""
