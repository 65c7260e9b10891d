"""`python -m jaxlm.hf`: import and export Hugging Face checkpoints (the command lives in jaxlm/cli/hf.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.hf import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
