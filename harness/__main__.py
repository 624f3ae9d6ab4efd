"""`python -m harness [overrides]`: compose (Hydra) -> plan -> run (see harness/cli.py)."""

import sys

from harness.cli import main
from harness.entry import run_command

if __name__ == "__main__":
    sys.exit(run_command(main))
