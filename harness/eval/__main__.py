import sys

from harness.eval.cli import main

sys.exit(main())
