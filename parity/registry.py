"""parity's command, registered with jaxlm's command list (`python -m jaxlm`; entry point group jaxlm.cli.registry)."""

from jaxlm.cli.registry import Command

COMMANDS = (
    Command("parity.check", "jaxlm against the PyTorch reference: logits, loss, gradients and the loss curve",
            needs="the 'torch' extra"),
)

EXTRAS = {"torch": "torch"}  # what parity's modules import -> the pyproject extra (jaxlm.core.extras)
