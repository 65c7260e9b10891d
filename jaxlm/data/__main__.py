"""`python -m jaxlm.data` (the command lives in jaxlm/cli/data.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.data import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
