"""Hang diagnosis: every thread's Python stack of this rank, written to the run dir, and the run goes on.

- `kill -USR1 <pid>` (the driver form passes it on to its ranks), at any point of the run (data, model build,
  training, evals): `<run_dir>/diagnostics/stacks-<rank>-<time>.txt`.
- `train.hang_timeout_s=S` (off by default): when no optimizer step completes within S seconds (the first one
  counted from the start of training), the same dump as `hang-<rank>-<time>.txt`, with a warning, once per
  hang; training is not stopped (a slow step is not killed: the stacks say where it waits).

A watcher thread writes both, with faulthandler.dump_traceback while it holds the GIL. Python's C-level signal
handler wakes it through `signal.set_wakeup_fd`, so a main thread blocked inside a collective or a kernel (which
releases the GIL) still gets its stacks dumped, where a Python-level handler would wait for the call to return.
faulthandler's own C-level dumps (`register`, `dump_traceback_later`) are not used: they read the other threads'
frames without the GIL, and on this machine a SIGUSR1 so handled crashed a training process (SIGSEGV) in one of
a few runs. Torch-free.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import select
import signal
import threading
import time
from pathlib import Path

log = logging.getLogger("harness")
DUMP_SIGNAL = signal.SIGUSR1
POLL_S = 0.5  # the watcher's wait between deadline checks; a stop wakes it at once (WAKE), not after a poll
WAKE = b"\0"  # written to the wakeup pipe by __exit__: no signal has number 0, so it is never forwarded


def _noop(signum, frame) -> None:  # the watcher thread does the work (woken through the wakeup fd)
    return None


class StackDumps:
    """For the whole run: SIGUSR1 dumps this rank's stacks. During training, with `hang_timeout_s`, so does a step
    that takes too long: `arm()` at the start of training, `step_done()` after every step, `disarm()` at its end
    (harness.run.callbacks.WatchdogCallback)."""

    def __init__(self, run_dir: Path | str, rank: int, hang_timeout_s: float | None = None):
        self.folder = Path(run_dir) / "diagnostics"
        self.rank, self.timeout = rank, hang_timeout_s
        self.written: list[Path] = []
        self._deadline = None  # monotonic time of the hang dump while armed; None when disarmed or dumped
        self._stop = threading.Event()
        self._r = self._w = None
        self._previous = None  # (SIGUSR1 handler, wakeup fd) to restore

    def __enter__(self) -> "StackDumps":
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._r, self._w = os.pipe()
            os.set_blocking(self._w, False)
            handler = signal.signal(DUMP_SIGNAL, _noop)
            self._previous = (handler, signal.set_wakeup_fd(self._w, warn_on_full_buffer=False))
        self._thread = threading.Thread(target=self._watch, name=f"harness-stacks-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.is_set():
            wait = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            if self._r is None:
                self._stop.wait(POLL_S if wait is None else min(wait, POLL_S))
                ready = False
            else:
                ready = select.select([self._r], [], [], POLL_S if wait is None else min(wait, POLL_S))[0]
            if ready:
                data = os.read(self._r, 512).replace(WAKE, b"")
                prev_fd = self._previous[1]
                if prev_fd >= 0 and data:  # whoever had the wakeup fd still hears of every signal
                    try:
                        os.write(prev_fd, data)
                    except OSError:
                        pass
                if DUMP_SIGNAL in data:
                    self._dump("stacks", "SIGUSR1")
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline and not self._stop.is_set():
                self._deadline = None  # once per hang: the next step re-arms it
                self._dump("hang", f"no step completed in {self.timeout:g} s (train.hang_timeout_s)")

    def _dump(self, kind: str, why: str) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:]
            path = self.folder / f"{kind}-{self.rank}-{stamp}.txt"
            with open(path, "w") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as exc:  # a diagnostic must not end the run
            log.warning("%s: could not write the stacks to %s: %s", why, self.folder, exc)
            return
        self.written.append(path)
        log.warning("%s: every thread's stack written to %s", why, path)

    def arm(self) -> None:
        if self.timeout:
            self.step_done()

    def step_done(self) -> None:
        if self.timeout:
            self._deadline = time.monotonic() + self.timeout

    def disarm(self) -> None:
        self._deadline = None

    def __exit__(self, *exc) -> None:
        self._deadline = None
        if self._previous is not None:
            handler, prev_fd = self._previous
            signal.set_wakeup_fd(prev_fd)
            signal.signal(DUMP_SIGNAL, handler)
        self._stop.set()
        if self._w is not None:  # wake the select now: a run (or each job of a sweep) would wait up to POLL_S
            try:
                os.write(self._w, WAKE)
            except OSError:  # a full pipe wakes it as well
                pass
        self._thread.join(timeout=5)
        for fd in (self._r, self._w):
            if fd is not None:
                os.close(fd)
