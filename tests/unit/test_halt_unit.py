"""harness.halt without a trainer: the exit codes, the handlers installed for training and restored after it,
a second signal ignored, a scheduler's handler (submitit's requeue) handed back to be called after the checkpoint."""

from __future__ import annotations

import os
import signal

from harness.halt import Halt, Halted, exit_code


def test_exit_codes_are_what_a_shell_reports_for_the_signal():
    assert exit_code(signal.SIGTERM) == 143 and exit_code(signal.SIGINT) == 130
    paused, term = Halted("paused", 3, "checkpoint-3"), Halted("interrupted", 5, "checkpoint-5", signum=signal.SIGTERM)
    assert paused.exit_code == 0 and term.exit_code == 143
    assert term.record() == {"status": "interrupted", "step": 5, "checkpoint": "checkpoint-5", "signal": "SIGTERM",
                             "exit_code": 143}


def test_signals_during_training_set_the_request_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
    with Halt() as halt:
        os.kill(os.getpid(), signal.SIGTERM)  # the process would die without the harness's handler
        os.kill(os.getpid(), signal.SIGINT)  # a second signal: logged, ignored (the first one is kept)
        assert halt.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGUSR2) == before[signal.SIGUSR2]  # no scheduler handler: left alone
        assert halt.scheduler_handler() is None
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_scheduler_handler_is_taken_over_and_handed_back():
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        with Halt() as halt:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert halt.signum == signal.SIGUSR2 and calls == []  # not requeued before the checkpoint
            then = halt.scheduler_handler()
        then(halt.signum, None)
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_scheduler_handler_is_still_known_after_training_gave_the_handlers_back():
    """The train stage asks for submitit's handler after `with halt:` has exited (the trainer returned at the step
    boundary): the handler is taken when the signal arrives, so it is not lost with the restored handlers (it was:
    the job exited 140 and SLURM recorded it FAILED, never requeued)."""
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        with Halt() as halt:
            os.kill(os.getpid(), signal.SIGUSR2)
        then = halt.scheduler_handler()  # after the block, as harness.run.stages.train asks
        assert then is not None and calls == []
        then(halt.signum, None)
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_rank_of_a_scheduled_driver_stops_on_sigusr2_without_a_handler_of_its_own(monkeypatch):
    """On SLURM the scheduler's SIGUSR2 reaches every process of the job; a rank started by the driver form has no
    submitit handler, and SIGUSR2's default action would kill it mid-step. The driver sets HARNESS_STOP_ON_USR2 for
    its ranks, and their training takes SIGUSR2 as a stop (with nothing to hand over: the driver requeues)."""
    from harness.halt import STOP_ON_USR2_ENV

    previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # what the driver's child inherits
    try:
        monkeypatch.setenv(STOP_ON_USR2_ENV, "1")
        with Halt() as halt:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert halt.signum == signal.SIGUSR2
        assert halt.scheduler_handler() is None and signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        monkeypatch.delenv(STOP_ON_USR2_ENV)
        with Halt() as halt:  # without the driver's word, SIGUSR2 keeps its handler (here: ignored)
            os.kill(os.getpid(), signal.SIGUSR2)
        assert halt.signum is None
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_hand_over_calls_the_deferred_handler_once():
    from harness.halt import defer, hand_over

    calls = []
    defer(lambda signum, frame: calls.append(signum), signal.SIGUSR2)
    defer(None, signal.SIGTERM)  # no scheduler handler: nothing deferred
    hand_over()
    hand_over()
    assert calls == [signal.SIGUSR2]


def test_a_hold_waits_for_a_stop_signal_or_its_file(tmp_path, monkeypatch):
    """harness.faults' `hold` (the SLURM tests' way to land a signal at a known step): it marks that it waits, ends
    when training receives a stop signal, and does not wait at all once the test made its file (a requeued
    attempt passes)."""
    import threading
    import time

    from harness import faults, halt

    hold_file = tmp_path / "release"
    monkeypatch.setenv(faults.HOLD_FILE_ENV, str(hold_file))
    monkeypatch.setenv(faults.FAULT_ENV, "rl.step@1:hold")
    monkeypatch.setattr(halt, "_RECEIVED", [])
    seen = []

    def signal_once_held():
        while not (tmp_path / "release.held-0").exists():
            time.sleep(0.01)
        seen.append("held")
        os.kill(os.getpid(), signal.SIGTERM)

    with Halt():
        t = threading.Thread(target=signal_once_held)
        t.start()
        faults.point("rl.step")  # returns once the signal arrived
        t.join()
    assert seen == ["held"] and halt.received() and not (tmp_path / "release.held-0").exists()
    monkeypatch.setattr(halt, "_RECEIVED", [])
    hold_file.write_text("")
    monkeypatch.setattr(faults, "_seen", {})
    faults.point("rl.step")  # the file exists: no wait, no signal needed
    assert not halt.received()
