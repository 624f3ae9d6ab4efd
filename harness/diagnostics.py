"""Hang diagnosis during training: every thread's Python stack of this rank, written to the run dir.

- `kill -USR1 <pid>` (the driver form passes it on to its ranks), at any point of the run (data, model build,
  training, evals): `<run_dir>/diagnostics/stacks-<rank>-<time>.txt`, and the run goes on.
- `train.hang_timeout_s=S` (off by default): when no optimizer step completes within S seconds (the first one
  counted from the start of training), the same dump as `hang-<rank>-<time>.txt`, with a warning; training is
  not stopped (a slow step is not killed: the stacks say where it waits).

Both are written by faulthandler from C (its signal handler, its watchdog thread), so they work while the
main thread is blocked inside a collective or a kernel, where a Python-level handler would never run. The
C side writes into a pipe (non-blocking: a dump that does not fit is cut, never a stall); a daemon thread
reads each dump and writes it to its own file. Torch-free.
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
QUIET_S = 0.3  # a dump is complete when its pipe has been quiet this long


class _Sink:
    """A pipe the C side writes dumps into and a daemon thread that files each dump as `<prefix>-<time>.txt`."""

    def __init__(self, folder: Path, prefix: str, what: str):
        self.folder, self.prefix, self.what = folder, prefix, what
        r, w = os.pipe()
        os.set_blocking(w, False)
        self.r, self.w = r, os.fdopen(w, "wb", buffering=0)
        self.written: list[Path] = []
        self._thread = threading.Thread(target=self._drain, name=f"harness-{prefix}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            chunks = []
            while True:
                ready, _, _ = select.select([self.r], [], [], QUIET_S if chunks else None)
                if not ready:
                    break  # quiet: the dump is complete
                data = os.read(self.r, 65536)
                if not data:  # the write end is closed
                    if chunks:
                        self._file(b"".join(chunks))
                    return
                chunks.append(data)
            self._file(b"".join(chunks))

    def _file(self, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:]
        path = self.folder / f"{self.prefix}-{stamp}.txt"
        path.write_bytes(data)
        self.written.append(path)
        log.warning("%s: every thread's stack written to %s", self.what, path)

    def close(self) -> None:
        self.w.close()
        self._thread.join(timeout=5)
        os.close(self.r)


class StackDumps:
    """For the whole run (data, model, training, evals): SIGUSR1 dumps this rank's stacks. During training, with
    `hang_timeout_s`, so does a step that takes too long: `arm()` at the start of training, `step_done()` after
    every step (re-arms), `disarm()` at its end (harness.callbacks.WatchdogCallback)."""

    def __init__(self, run_dir: Path | str, rank: int, hang_timeout_s: float | None = None):
        self.folder = Path(run_dir) / "diagnostics"
        self.rank, self.timeout = rank, hang_timeout_s
        self._signal = self._hang = None
        self._armed = False

    def __enter__(self) -> "StackDumps":
        self._signal = _Sink(self.folder, f"stacks-{self.rank}", "SIGUSR1")
        faulthandler.register(DUMP_SIGNAL, file=self._signal.w, all_threads=True, chain=False)
        return self

    def arm(self) -> None:
        if not self.timeout:
            return
        if self._hang is None:
            self._hang = _Sink(self.folder, f"hang-{self.rank}", f"no step completed in {self.timeout:g} s "
                               "(train.hang_timeout_s)")
        self._armed = True
        self.step_done()

    def step_done(self) -> None:
        if self._armed:
            faulthandler.cancel_dump_traceback_later()
            faulthandler.dump_traceback_later(self.timeout, repeat=False, file=self._hang.w, exit=False)

    def disarm(self) -> None:
        if self._armed:
            faulthandler.cancel_dump_traceback_later()
            self._armed = False

    def __exit__(self, *exc) -> None:
        faulthandler.unregister(DUMP_SIGNAL)
        self.disarm()
        for sink in (self._hang, self._signal):
            if sink is not None:
                sink.close()

    @property
    def written(self) -> list[Path]:
        return [*(self._signal.written if self._signal else []), *(self._hang.written if self._hang else [])]
