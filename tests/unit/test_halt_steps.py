"""A planned stop, step by step: budget.stop_after_steps=N asks to stop at the end of step N (not N+1, not N-1), a
SIGTERM received during step k stops after step k, on every rank, and the stop's checkpoint is saved at that step:
resumable (not the run's final one), and a start with the same pause stays paused. HaltCallback is driven with
transformers' own TrainerState / TrainerControl, then inside a Trainer's step loop (tests/unit/trainer_sim.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from harness import rundir
from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
from harness.accounting.logs import ledger_path, read_rows
from harness.run.callbacks import HaltCallback
from harness.run.context import RunContext
from harness.halt import Halt, Halted
from harness.run.stages.resume import find
from tests.unit.trainer_sim import Ranks, train


def drive(cb: HaltCallback, max_steps: int = 10, during=None) -> list[tuple[int, bool, bool]]:
    """HaltCallback at the end of steps 1..max_steps as the Trainer calls it; `during(step)` runs inside each step.
    (step, should_training_stop, should_save) for each step until the first stop."""
    state, control, out = TrainerState(max_steps=max_steps), TrainerControl(), []
    for step in range(1, max_steps + 1):
        control.should_save = False  # (CallbackHandler.on_step_begin)
        if during is not None:
            during(step)
        state.global_step = step
        cb.on_step_end(SimpleNamespace(), state, control)
        out.append((step, control.should_training_stop, control.should_save))
        if control.should_training_stop:
            break
    return out


def ctx() -> RunContext:
    return RunContext(run_dir=None, plan=SimpleNamespace(rl=True))


@pytest.mark.parametrize("n", [1, 3, 5])
def test_a_pause_stops_after_its_step_not_one_later(n):
    c = ctx()
    steps = drive(HaltCallback(c, Halt(), stop_after_steps=n))
    assert steps == [(k, False, False) for k in range(1, n)] + [(n, True, True)], \
        f"budget.stop_after_steps={n}: (step, stop, save) were {steps}"
    assert c.halted == {"status": "paused", "step": n, "signum": None}


def test_no_stop_after_steps_never_pauses():
    c = ctx()
    assert drive(HaltCallback(c, Halt(), stop_after_steps=None), max_steps=6)[-1] == (6, False, False)
    assert c.halted is None  # (the Trainer's own flow stops at max_steps)


@pytest.mark.parametrize("k", [1, 4])
def test_a_signal_during_a_step_stops_after_that_step(k):
    """A real SIGTERM to this process during step k, with the harness's handler installed (harness.halt.Halt)."""
    c = ctx()
    with Halt() as halt:
        steps = drive(HaltCallback(c, halt, stop_after_steps=None),
                      during=lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == k else None)
    assert steps[-1] == (k, True, True) and len(steps) == k, f"SIGTERM during step {k}: {steps}"
    assert c.halted == {"status": "interrupted", "step": k, "signum": signal.SIGTERM}


def test_a_stop_at_the_step_where_training_ends_anyway_is_no_pause():
    c = ctx()
    assert drive(HaltCallback(c, Halt(), stop_after_steps=6), max_steps=6)[-1] == (6, False, False)
    assert c.halted is None  # its checkpoint is the final one: nothing to continue


@pytest.fixture
def plan(plan_of):
    return plan_of("arm=grpo")


def tokens(rank: int, step: int, j: int) -> int:
    return (rank + step + j) % 9


def test_a_pause_saves_a_resumable_checkpoint_of_its_step_and_stays_paused(plan, monkeypatch):
    rundir.claim(plan).release()
    run_dir = Path(plan.run_dir)
    ranks = Ranks(1, monkeypatch)
    (paused,) = train(plan, run_dir, ranks, tokens, save_steps=2, stop_after=3)
    assert (paused.steps, paused.saved) == (3, [2, 3]), f"paused after step {paused.steps}, saved at {paused.saved}"
    assert paused.ctx.halted == {"status": "paused", "step": 3, "signum": None} and not paused.ctx.stopped_by_budget
    m = json.loads((run_dir / "checkpoints/checkpoint-3" / CHECKPOINT_MANIFEST).read_text())
    assert m["step"] == 3 and m["permanent"] is False
    assert {r["step"] for r in read_rows(run_dir / ledger_path(0))} == {0, 1, 2}  # nothing sampled after the pause
    # the same command (the same pause) stays paused; one that pauses later trains exactly to its step
    resume = find(plan, run_dir)
    assert resume.checkpoint.name == "checkpoint-3"
    with pytest.raises(Halted) as stays:
        resume.stays_paused(3)
    assert (stays.value.status, stays.value.step, stays.value.exit_code) == ("paused", 3, 0)
    resume.stays_paused(4)  # goes on
    (later,) = train(plan, run_dir, ranks, tokens, resume=resume, save_steps=2, stop_after=4)
    assert (later.steps, later.saved) == (4, [4]), f"paused after step {later.steps}, saved at {later.saved}"
    assert later.ctx.halted == {"status": "paused", "step": 4, "signum": None}


def test_a_signal_on_one_rank_stops_both_after_that_step_with_one_checkpoint(plan_of, monkeypatch):
    """SIGTERM reaches rank 1 only, during step 3: the signal is all-reduced, both ranks stop after step 3, and
    checkpoint-3 holds both ranks' frontiers, resumable."""
    plan = plan_of("arm=grpo", "placement=ddp", "placement.num_processes=2")
    run_dir = Path(plan.run_dir)
    runs = train(plan, run_dir, Ranks(2, monkeypatch), tokens, save_steps=2, signals={1: 3})
    assert [(r.steps, r.saved) for r in runs] == [(3, [2, 3]), (3, [2, 3])], \
        f"(stopped after, saved at) on each rank: {[(r.steps, r.saved) for r in runs]}"
    assert [r.ctx.halted for r in runs] == [{"status": "interrupted", "step": 3, "signum": signal.SIGTERM}] * 2
    m = json.loads((run_dir / "checkpoints/checkpoint-3" / CHECKPOINT_MANIFEST).read_text())
    assert m["permanent"] is False and set(m["frontier"]) == {"rank-0", "rank-1"}
    for r in (0, 1):
        assert {row["step"] for row in read_rows(run_dir / ledger_path(r))} == {0, 1, 2}
