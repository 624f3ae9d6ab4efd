"""`python -m harness [overrides]`: compose (Hydra) -> plan -> run (see harness/cli.py)."""

from harness.cli import main

if __name__ == "__main__":
    main()
