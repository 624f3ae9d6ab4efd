"""Stopping a run early on purpose, at a step boundary, with a checkpoint the same command continues from.

- A signal during training: SIGTERM (SLURM preemption and time limit, `kill`), SIGINT (Ctrl-C, once) and,
  when a job scheduler installed a handler for it (submitit: its requeue signal), SIGUSR2. The current
  optimizer step finishes, a checkpoint is published, the run is marked `interrupted` (not failed) and the
  process exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), what a shell reports for a
  process the signal ended. A scheduler's own handler (submitit's requeue) is handed over (`defer`) and called by
  the entry point (`hand_over`) once the checkpoint is published and the sweep job's record is written: it may
  exit the process (submitit requeues the job, then exits).
  A second signal while that happens is logged and ignored; SIGKILL still ends the process at once (and the
  run resumes from its newest checkpoint, as after any crash).
- `budget.stop_after_steps=N` (not semantic): stop after optimizer step N with a checkpoint; the run is marked
  `paused` and the process exits 0. The same command without it continues to the planned end, with the same
  result as a run that never stopped.

Outside training (data, model build, evals) the signals keep their default behaviour: nothing there is
half-written (every file is written atomically) and the run resumes from its newest checkpoint.
Torch-free; the callback that acts on it is harness.run.callbacks.HaltCallback.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass

log = logging.getLogger("harness")

ALWAYS = (signal.SIGTERM, signal.SIGINT)
SCHEDULER = (signal.SIGUSR2,)  # handled only when a scheduler (submitit) installed a Python handler for it
STOP_ON_USR2_ENV = "HARNESS_STOP_ON_USR2"  # set by the driver form for its ranks when its own SIGUSR2 is a scheduler's


_RECEIVED: list[int] = []  # every stop signal a Halt of this process received (harness.faults' hold waits on it)


def received() -> bool:
    """Whether training in this process has received a stop signal."""
    return bool(_RECEIVED)


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
        self._scheduler = None  # the scheduler's handler of the signal received, taken when it arrived

    @staticmethod
    def takes(sig: int, prev) -> bool:
        """Whether training takes `sig` over: SIGTERM and SIGINT always; SIGUSR2 when a scheduler installed a handler
        for it (submitit), or in a rank whose driver asked for it (HARNESS_STOP_ON_USR2: on SLURM the scheduler's
        signal reaches every process of the job, and its default action would kill the rank mid-step)."""
        if sig not in SCHEDULER:
            return True
        return callable(prev) or os.environ.get(STOP_ON_USR2_ENV) == "1"

    def __enter__(self) -> "Halt":
        if threading.current_thread() is not threading.main_thread():
            log.debug("halt: not the main thread; signals keep their handlers")
            return self
        for sig in (*ALWAYS, *SCHEDULER):
            prev = signal.getsignal(sig)
            if not self.takes(sig, prev):
                continue
            self._previous[sig] = prev
            signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        _RECEIVED.append(signum)
        if self.signum is None:
            self.signum = signum
            self._scheduler = scheduler_handler_of(self._previous.get(signum))
            log.warning("%s: finishing the current step, then a checkpoint and exit %d (the same command continues "
                        "the run)", signal_name(signum), exit_code(signum))
        else:
            log.warning("%s: already stopping after this step (%s); ignored until the checkpoint is published",
                        signal_name(signum), signal_name(self.signum))

    def scheduler_handler(self):
        """The handler a scheduler installed for the signal received (submitit's requeue), to call after the
        checkpoint; None for the default handlers (the harness exits with 128 + signum itself). Taken when the
        signal arrived, so it is still known after training's `with halt:` block gave the handlers back."""
        return self._scheduler


def scheduler_handler_of(prev):
    """`prev` when it is a scheduler's own Python handler, None for Python's defaults (SIG_DFL, SIG_IGN, the
    KeyboardInterrupt handler of SIGINT)."""
    if callable(prev) and prev is not signal.default_int_handler:
        return prev
    return None


# --- the hand-over to a scheduler's handler, once everything of the job is written

_DEFERRED: list[tuple[object, int]] = []


def defer(handler, signum: int) -> None:
    """Keep a scheduler's handler of `signum` (submitit: requeue the job, then exit) for `hand_over`: the run is
    marked interrupted first, and a sweep job's record (<sweep dir>/jobs/<n>.json) is written before it is called."""
    if handler is not None:
        _DEFERRED.append((handler, signum))


def hand_over() -> None:
    """Call the deferred scheduler handler (at most one per process: the first stop signal's). submitit's requeues
    the SLURM job and exits the process (SystemExit); on a task other than SLURM's rank 0 it only logs."""
    while _DEFERRED:
        handler, signum = _DEFERRED.pop(0)
        _DEFERRED.clear()
        log.info("%s: handing over to the scheduler's handler (submitit: requeue this job)", signal_name(signum))
        handler(signum, None)


class Halted(Exception):
    """Raised by the train stage after a planned stop's checkpoint: the lifecycle marks the run `status`
    (interrupted | paused) instead of finishing it, and the process exits with `exit_code`."""

    def __init__(self, status: str, step: int, checkpoint: str | None, signum: int | None = None, then=None):
        self.status, self.step, self.checkpoint, self.signum = status, step, checkpoint, signum
        self.then = then  # a scheduler's handler of that signal (submitit: requeue): deferred once the run is marked
        how = f"by {signal_name(signum)}" if signum else f"at budget.stop_after_steps={step}"
        super().__init__(f"{status} {how} after step {step}")

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum) if self.signum else 0

    def record(self) -> dict:
        """What the manifest keeps under `halt`."""
        return {"status": self.status, "step": self.step, "checkpoint": self.checkpoint,
                "signal": signal_name(self.signum) if self.signum else None, "exit_code": self.exit_code}
