"""The harness's console: one logger, `[harness] ...` lines on stderr (stdout stays machine-readable:
mode=plan prints JSON there). Standard library only; every entry point calls `setup_logging`."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("harness")


class BarSafeHandler(logging.StreamHandler):
    """A line goes above a live tqdm progress bar (tqdm.write: the bar is cleared, the line written, the bar
    redrawn) instead of being glued to the end of the bar's line. tqdm is looked up, never imported here."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm_mod = sys.modules.get("tqdm")
        if tqdm_mod is None or not getattr(tqdm_mod.tqdm, "_instances", None):
            return super().emit(record)
        try:
            tqdm_mod.tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001  (logging's contract: report, never raise)
            self.handleError(record)


def setup_logging() -> None:
    if log.handlers:
        return
    handler = BarSafeHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[harness] %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def quiet_libraries() -> None:
    """Keep the console to the harness's lines and TRL's progress bar (in the processes that train or eval)."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights", "Writing model shards"
    hf_logging.set_verbosity_error()
    for mod in ("transformers", "trl", "peft", "accelerate", "torch"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=mod)
        warnings.filterwarnings("ignore", category=UserWarning, module=mod)
