"""`python -m jaxlm.lora`: merge a LoRA run's adapters (the command lives in jaxlm/cli/lora.py)."""

import sys

from jaxlm import cli
from jaxlm.cli.lora import main

if __name__ == "__main__":
    sys.exit(cli.run(main))
