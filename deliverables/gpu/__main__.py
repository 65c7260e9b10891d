"""`python -m deliverables.gpu`: the GPU campaign (deliverables/gpu/campaign.py)."""

import sys

from deliverables.gpu.campaign import main
from jaxlm import cli

if __name__ == "__main__":
    sys.exit(cli.run(main))
