"""The lab's command, registered with jaxlm's command list (`python -m jaxlm`; entry point group jaxlm.cli.registry)."""

from jaxlm.cli.registry import Command

COMMANDS = (
    Command("experiments.run", "run a study plan: its runs one after another, each resumable, recorded for its "
            "report"),
)
