"""`python -m jaxlm.memory`: one step's memory per device (the command lives in jaxlm/cli/memory.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.memory import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
