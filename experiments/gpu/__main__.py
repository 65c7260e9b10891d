"""`python -m experiments.gpu`: the GPU campaign (experiments/gpu/campaign.py)."""

import sys

from experiments.gpu.campaign import main
from jaxlm import cli

if __name__ == "__main__":
    sys.exit(cli.run(main))
