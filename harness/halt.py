"""Stopping a run early on purpose, at a step boundary, with a checkpoint the same command continues from.

- A signal during training: SIGTERM (SLURM preemption and time limit, `kill`), SIGINT (Ctrl-C, once) and,
  when a job scheduler installed a handler for it (submitit: its requeue signal), SIGUSR2. The current
  optimizer step finishes, a checkpoint is published, the run is marked `interrupted` (not failed) and the
  process exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), what a shell reports for a
  process the signal ended. A scheduler's own handler (submitit's requeue) is called after the checkpoint.
  A second signal while that happens is logged and ignored; SIGKILL still ends the process at once (and the
  run resumes from its newest checkpoint, as after any crash).
- `budget.stop_after_steps=N` (not semantic): stop after optimizer step N with a checkpoint; the run is marked
  `paused` and the process exits 0. The same command without it continues to the planned end, with the same
  result as a run that never stopped.

Outside training (data, model build, evals) the signals keep their default behaviour: nothing there is
half-written (every file is written atomically) and the run resumes from its newest checkpoint.
Torch-free; the callback that acts on it is harness.callbacks.HaltCallback.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

log = logging.getLogger("harness")

ALWAYS = (signal.SIGTERM, signal.SIGINT)
SCHEDULER = (signal.SIGUSR2,)  # handled only when a scheduler (submitit) installed a Python handler for it


def exit_code(signum: int) -> int:
    """The exit code of a run interrupted by `signum`: 128 + its number, as a shell reports a process it ended."""
    return 128 + int(signum)


def interrupted(code: int) -> bool:
    """An exit code of a run stopped by a signal with its checkpoint published (128 + the signal's number), not a
    failure: the harness's own error codes are below 10."""
    return code > 128


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@dataclass
class Halt:
    """The stop request of this process's training: set by a signal handler, read at every step end."""

    signum: int | None = None  # the first signal received during training

    def __post_init__(self):
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "Halt":
        if threading.current_thread() is not threading.main_thread():
            log.debug("halt: not the main thread; signals keep their handlers")
            return self
        for sig in (*ALWAYS, *SCHEDULER):
            prev = signal.getsignal(sig)
            if sig in SCHEDULER and not callable(prev):
                continue
            self._previous[sig] = prev
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("%s: finishing the current step, then a checkpoint and exit %d (the same command continues "
                        "the run)", signal_name(signum), exit_code(signum))
        else:
            log.warning("%s: already stopping after this step (%s); ignored until the checkpoint is published",
                        signal_name(signum), signal_name(self.signum))

    def scheduler_handler(self):
        """The handler a scheduler installed for the signal received (submitit's requeue), to call after the
        checkpoint; None for the default handlers (the harness exits with 128 + signum itself)."""
        prev = self._previous.get(self.signum) if self.signum is not None else None
        if callable(prev) and prev is not signal.default_int_handler:
            return prev
        return None


class Halted(Exception):
    """Raised by the train stage after a planned stop's checkpoint: the lifecycle marks the run `status`
    (interrupted | paused) instead of finishing it, and the process exits with `exit_code`."""

    def __init__(self, status: str, step: int, checkpoint: str | None, signum: int | None = None, then=None):
        self.status, self.step, self.checkpoint, self.signum = status, step, checkpoint, signum
        self.then = then  # a scheduler's handler of that signal (submitit: requeue), called once the run is marked
        how = f"by {signal_name(signum)}" if signum else f"at budget.stop_after_steps={step}"
        super().__init__(f"{status} {how} after step {step}")

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum) if self.signum else 0

    def record(self) -> dict:
        """What the manifest keeps under `halt`."""
        return {"status": self.status, "step": self.step, "checkpoint": self.checkpoint,
                "signal": signal_name(self.signum) if self.signum else None, "exit_code": self.exit_code}
