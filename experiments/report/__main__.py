import sys

from experiments.report.build import main
from jaxlm import cli

sys.exit(cli.run(main))
