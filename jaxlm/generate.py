"""`python -m jaxlm.generate`: sample text from a trained run (the command lives in jaxlm/cli/generate.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.generate import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
