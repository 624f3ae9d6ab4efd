"""The one way every command line entry point runs (`python -m harness`, harness.data, .eval, .verify, .report,
.port): its `main`, then stdout flushed, and a reader that went away (`python -m harness mode=plan | head -1`)
ends it quietly with 141 (128 + SIGPIPE, what a shell reports for a writer its reader left), not a
BrokenPipeError traceback. Standard library only (the torch-free commands import it)."""

from __future__ import annotations

import os
import sys
from typing import Callable

CLOSED_PIPE_EXIT = 141


def run_command(main: Callable[[], int | None]) -> int | str | None:
    """`main()`'s exit code (its SystemExit's too), or CLOSED_PIPE_EXIT when stdout's reader closed the pipe."""
    try:
        try:
            code = main()
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe prints "Exception ignored ..."
        return code
    except BrokenPipeError:
        try:  # what Python still flushes at exit goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return CLOSED_PIPE_EXIT
