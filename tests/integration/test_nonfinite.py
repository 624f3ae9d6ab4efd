"""The non-finite guard (harness.run.callbacks.NonFiniteCallback): a step whose gradient is NaN (injected through
HARNESS_TEST_NONFINITE_STEPS) is not applied (neither the optimizer's nor the scheduler's step), is counted in
metrics, checkpoints and completion.json, and the count survives a resume; over train.max_nonfinite_steps the run
stops with a clear error and its newest checkpoint intact. A non-finite reward weight is refused at plan time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.accounting.logs import read_rows
from harness.run.callbacks import NONFINITE_TEST_ENV
from tests.conftest import run_harness

ARGS = ["debug=tiny", "arm.init=scratch", "budget.max_completion_tokens=4096"]  # 8 GRPO steps, a checkpoint every 2


def _run(out: Path) -> Path:
    (d,) = (out / "runs").glob("grpo-*")
    return d


def _applied_updates(ckpt: Path) -> tuple[int, int]:
    """(the optimizer's step count, the scheduler's) in a checkpoint: the updates actually applied."""
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    sched = torch.load(ckpt / "scheduler.pt", weights_only=False)
    return int(next(iter(opt["state"].values()))["step"]), int(sched["last_epoch"])


@pytest.mark.slow  # the default suite stays near 15 min; the stop over the limit stays
def test_nonfinite_steps_are_skipped_counted_and_the_count_survives_resume(tmp_path):
    out = tmp_path / "out"
    first = run_harness(*ARGS, f"output_root={out}", "budget.stop_after_steps=4", env={NONFINITE_TEST_ENV: "3"},
                        timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "step 3: the gradient is not finite; the update was skipped (1 such step(s)" in first.stderr
    run = _run(out)
    ck4 = json.loads((run / "checkpoints/checkpoint-4/harness_checkpoint.json").read_text())
    assert ck4["totals"]["nonfinite_steps"] == 1
    assert _applied_updates(run / "checkpoints/checkpoint-4") == (3, 3)  # 4 steps, 3 updates
    assert _applied_updates(run / "checkpoints/checkpoint-2") == (2, 2)
    # continued (the pause lifted), with step 5 poisoned too: the count goes on from the checkpoint's
    second = run_harness(*ARGS, f"output_root={out}", env={NONFINITE_TEST_ENV: "5"}, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "step 5: the gradient is not finite; the update was skipped (2 such step(s)" in second.stderr
    comp = json.loads((run / "completion.json").read_text())
    steps = comp["optimizer_steps"]
    assert comp["nonfinite_steps"] == 2 and steps == 8
    assert _applied_updates(run / f"checkpoints/checkpoint-{steps}") == (steps - 2, steps - 2)
    rows = {r["step"]: r for r in read_rows(run / "metrics.jsonl")}
    assert "nonfinite_steps" not in rows[2] and rows[3]["nonfinite_steps"] == 1 and rows[steps]["nonfinite_steps"] == 2
    # the skipped steps' samples were spent: the ledger has every step's completions
    assert sorted({r["step"] for r in read_rows(run / "ledgers/rank-0.jsonl")}) == list(range(steps))


def test_over_max_nonfinite_steps_the_run_stops_with_its_last_good_checkpoint(tmp_path):
    out = tmp_path / "out"
    proc = run_harness(*ARGS, f"output_root={out}", "train.max_nonfinite_steps=1", env={NONFINITE_TEST_ENV: "3,4"},
                       timeout=600)
    assert proc.returncode == 8, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "NonFiniteError: train.max_nonfinite_steps = 1: 2 optimizer step(s) of this run had a non-finite " \
           "gradient (in this process: steps 3, 4); none was applied; training stopped and the newest checkpoint " \
           "checkpoint-2 is intact" in proc.stderr
    assert "fix: lower arm.learning_rate" in proc.stderr
    run = _run(out)
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "failed"
    assert sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (run / "completion.json").exists()


def test_a_non_finite_reward_weight_is_refused_at_plan_time(tmp_path):
    proc = run_harness("mode=plan", f"output_root={tmp_path}", "reward.correct=nan", "reward.invalid_penalty=inf")
    assert proc.returncode == 2
    assert "reward.correct = nan: must be a finite number" in proc.stderr
    assert "reward.invalid_penalty = inf: must be a finite number" in proc.stderr
