import sys

from harness.verify import main

sys.exit(main())
