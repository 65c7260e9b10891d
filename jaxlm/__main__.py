"""`python -m jaxlm`: every command, one line each (the list is jaxlm/cli/registry.py)."""

import sys

from jaxlm import cli
from jaxlm.cli import registry


def main(argv: list[str]) -> int:
    parser = cli.ArgumentParser(prog="python -m jaxlm", needs=registry.CORE, description="List jaxlm's commands "
                                f"and those the packages beside it register (entry point group {registry.GROUP}).")
    parser.parse_args(argv)
    print(registry.listing())
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
