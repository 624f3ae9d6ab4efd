import sys

from harness.entry import run
from harness.eval.cli import main

sys.exit(run(main))
