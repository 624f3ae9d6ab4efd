"""harness.diagnostics: SIGUSR1 files every thread's stack of this process and it goes on; the hang watchdog
files one when no step completes in time, and not while steps keep completing. Both from a watcher thread, so
a main thread blocked in C with the GIL released (here: time.sleep) does not stop them."""

from __future__ import annotations

import os
import signal
import time

from harness.diagnostics import StackDumps


def _wait_for(pred, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_sigusr1_writes_every_threads_stack_and_the_process_goes_on(tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    with StackDumps(tmp_path, rank=0) as dumps:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _wait_for(lambda: len(dumps.written) == 1)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _wait_for(lambda: len(dumps.written) == 2)
    (first, second) = sorted((tmp_path / "diagnostics").glob("stacks-0-*.txt"))
    text = first.read_text()
    assert "test_sigusr1_writes_every_threads_stack" in text  # this test's frame, in the main thread
    assert "Thread 0x" in text and "_watch" in text  # all threads: the watcher's own too
    assert signal.getsignal(signal.SIGUSR1) == before  # the handler is gone after training


class _Clock:
    """The watchdog's monotonic clock, moved by the test alone: no stall of the machine can look like a hang."""

    def __init__(self):
        self.now = 1000.0

    def __getattr__(self, name):  # strftime, gmtime, time: the real ones
        return getattr(time, name)

    def monotonic(self) -> float:
        return self.now


def test_the_watchdog_dumps_a_step_that_takes_too_long_and_only_then(tmp_path, monkeypatch):
    import harness.diagnostics as diag

    clock = _Clock()
    monkeypatch.setattr(diag, "time", clock)
    monkeypatch.setattr(diag, "POLL_S", 0.02)  # the watcher looks at the clock every 20 ms of real time

    def idle():  # long enough for the watcher to look several times
        time.sleep(0.2)

    with StackDumps(tmp_path, rank=1, hang_timeout_s=0.5) as dumps:
        clock.now += 10.0  # not armed yet (outside training): no dump
        idle()
        dumps.arm()
        for _ in range(6):  # steps of 0.4 s: each re-arms the watchdog in time
            clock.now += 0.4
            idle()
            dumps.step_done()
        assert dumps.written == []
        clock.now += 0.6  # a "hung" step
        assert _wait_for(lambda: len(dumps.written) == 1)
        clock.now += 5.0  # once per hang: no second dump until a step re-arms it
        idle()
        assert len(dumps.written) == 1
        dumps.step_done()
        dumps.disarm()  # the end of training
        clock.now += 10.0
        idle()
        assert len(dumps.written) == 1
    (hang,) = (tmp_path / "diagnostics").glob("hang-1-*.txt")
    assert "test_the_watchdog_dumps_a_step_that_takes_too_long" in hang.read_text()


def test_leaving_wakes_the_watcher_at_once_and_forwards_no_wake_byte(tmp_path, monkeypatch):
    """__exit__ wakes the watcher's select through the pipe: with a poll far longer than __exit__'s join timeout
    (5 s), the thread must still have ended when the block is left (every run, every sweep job waited up to a
    poll, 0.5 s, here). The wake byte is not a signal: the previous wakeup fd never sees it."""
    import harness.diagnostics as diag

    monkeypatch.setattr(diag, "POLL_S", 60.0)
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        with StackDumps(tmp_path, rank=0) as dumps:
            time.sleep(0.2)  # the watcher is in its select
        assert not dumps._thread.is_alive()
        try:
            leaked = os.read(r, 512)
        except BlockingIOError:
            leaked = b""
        assert diag.WAKE not in leaked
    finally:
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
