"""harness.run.lifecycle.run_objects: during a run the cyclic garbage collector skips what was alive before it
(transformers' Trainer collects before every training loop: 0.29 s of a 20-step tiny run was that scan), and
when the run ends its own cycles are freed and the collector sees everything again."""

from __future__ import annotations

import gc
import weakref

import pytest

from harness.run.lifecycle import run_objects


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def cycle() -> weakref.ref:
    return weakref.ref(Node())  # the Node is garbage at once, kept by its cycle


@pytest.fixture(autouse=True)
def unfrozen():
    """No automatic collection during a test (only the explicit ones decide what is freed when), and an
    unfrozen process before and after it."""
    assert gc.get_freeze_count() == 0, "the test process is frozen already"
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    gc.unfreeze()
    if was_enabled:
        gc.enable()


@pytest.fixture
def unfreezes(monkeypatch) -> list[int]:
    """Each gc.unfreeze() call, recorded (and made). Not the freeze count: a frozen object another thread lets go
    of leaves the permanent generation, so the count may fall by a few without anything being unfrozen."""
    calls, real = [], gc.unfreeze
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append(gc.get_freeze_count()) or real())
    return calls


def test_a_collection_during_the_run_skips_what_was_alive_before_it():
    before = cycle()
    with run_objects():
        assert gc.get_freeze_count() > 0
        during = cycle()
        gc.collect()  # what accelerate's free_memory does before the training loop
        assert before() is not None, "the collection during the run scanned an object from before it"
        assert during() is None, "the run's own garbage must still be collected"
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert before() is None, "the objects frozen for the run must go back to the collector"


def test_the_runs_cycles_are_freed_when_it_ends():
    with run_objects():
        model = cycle()  # a trainer, a model: cycles the run leaves behind
        assert model() is not None
    assert model() is None, "the run's cycles must be freed before the next job of the process starts"


def test_a_nested_run_leaves_the_outer_freeze_alone(unfreezes):
    before = cycle()
    with run_objects():
        with run_objects():
            inner = cycle()
        assert unfreezes == [] and gc.get_freeze_count() > 0, "the inner run unfroze the outer run's objects"
        gc.collect()
        assert before() is not None
        assert inner() is None
    assert gc.get_freeze_count() == 0


def test_a_failing_run_unfreezes():
    with pytest.raises(RuntimeError):
        with run_objects():
            leftover = cycle()
            raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0
    assert leftover() is None
    with run_objects():  # and the next run freezes again
        assert gc.get_freeze_count() > 0


def test_a_process_frozen_by_someone_else_stays_frozen(unfreezes):
    gc.freeze()  # e.g. a launcher that froze its objects before forking workers
    with run_objects():
        pass
    assert unfreezes == [] and gc.get_freeze_count() > 0, "the run unfroze objects it did not freeze"
