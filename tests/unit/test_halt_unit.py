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
