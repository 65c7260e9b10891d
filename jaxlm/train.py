"""`python -m jaxlm.train`: train a Transformer LM (the command lives in jaxlm/cli/train.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.train import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
