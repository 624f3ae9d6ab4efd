import sys

from harness.entry import run
from harness.verify import main

sys.exit(run(main))
