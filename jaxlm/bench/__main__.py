"""`python -m jaxlm.bench` (the command lives in jaxlm/cli/bench.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.bench import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
