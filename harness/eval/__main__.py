import sys

from harness.entry import run_command
from harness.eval.cli import main

sys.exit(run_command(main))
