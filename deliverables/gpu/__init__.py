"""The GPU campaign, `python -m deliverables.gpu`, and its offline-machine form (docs/gpu.md)."""
