"""`python -m jaxlm.bench` (the command lives in jaxlm/bench/commands.py)."""

import sys

from jaxlm import cli
from jaxlm.bench.commands import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
