"""`python -m jaxlm.quantize`: post-training quantisation of runs (the command lives in jaxlm/cli/quantize.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.quantize import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
