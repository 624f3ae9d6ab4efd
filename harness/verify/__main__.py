import sys

from harness.entry import run_command
from harness.verify import main

sys.exit(run_command(main))
