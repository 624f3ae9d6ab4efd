"""`python -m harness.report DIR [--baseline grpo] [--out DIR/report]` (see harness/report/cli.py)."""

import sys

from harness.entry import run_command
from harness.report.cli import main

if __name__ == "__main__":
    sys.exit(run_command(main))
