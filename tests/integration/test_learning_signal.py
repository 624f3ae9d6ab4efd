"""A run that cannot learn says so (harness.run.learning): in the console, in completion.json and in the metrics rows.

Two real runs of the tiny VLM, each with a cheap eval (8 views):
- GRPO from scratch (random weights): not one completion is a well-formed answer, every reward is the format
  penalty, every group is flat. The monitor names that cause, from step 1, once.
- GRPO after a warm start on a dataset whose every answer is "red": the warm start answers "red" everywhere, so
  the eval before RL is at its ceiling. The run says there is nothing left to learn on that split.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from tests.conftest import run_dir_of, run_harness
from tests.own_data import write_colour_set

PINNED = {"OMP_NUM_THREADS": "1"}
CHEAP = ("debug=tiny", "data.eval_max_items=8")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    out = tmp_path_factory.mktemp("scratch")
    proc = run_harness(*CHEAP, "arm.init=scratch", "train.signal_window=2", "budget.max_completion_tokens=1536",
                       f"output_root={out}", timeout=600, env=PINNED)
    assert proc.returncode == 0, proc.stderr[-4000:]  # never stopped for it: budget parity first
    return run_dir_of(out, "grpo"), proc.stderr


def test_a_run_whose_every_group_is_flat_says_so_once_in_the_console(scratch):
    _, stderr = scratch
    said = [line for line in stderr.splitlines() if line.startswith("[harness] NO LEARNING SIGNAL:")]
    assert len(said) == 1, stderr[-3000:]
    assert "not one of the" in said[0] and "from step 1 was a well-formed answer" in said[0], said[0]
    assert "every group's advantage is 0" in said[0] and "grpo's loss has no other term" in said[0]
    assert "fix: start RL from a policy that writes the answer format" in stderr
    # and the end-of-run summary repeats it with the whole stretch and the gradient TRL logged
    assert "[harness] NO LEARNING SIGNAL from step 1 to the end of training" in stderr
    assert "grad_norm at most 0 over those steps" in stderr


def test_completion_json_and_the_metrics_rows_carry_the_same_statement(scratch):
    run, stderr = scratch
    comp = json.loads((run / "completion.json").read_text())
    signal = comp["learning_signal"]
    found = signal["no_update"]
    assert found["cause"] == "no_well_formed" and found["since_step"] == 1 and found["recovered_at"] is None
    assert found["rounds"] == signal["rounds"] == comp["optimizer_steps"] >= 2
    assert found["well_formed"] == 0.0 and found["flat_groups"] == 1.0 and found["grad_norm_max"] == 0.0
    assert found["text"] in stderr
    assert signal["flat_groups"] == 1.0 and signal["well_formed"] == 0.0 and signal["reward_std_mean"] == 0.0
    assert signal["eval_before_at_ceiling"] is None
    rows = list(read_rows(run / "metrics.jsonl"))
    assert [r["signal/flat_groups"] for r in rows] == [1.0] * len(rows)
    assert [r["signal/well_formed"] for r in rows] == [0.0] * len(rows)
    # the statement holds from the step that completed the window (train.signal_window=2)
    assert [r["signal/no_update"] for r in rows] == [0] + [1] * (len(rows) - 1)


def _all_red(root: Path) -> Path:
    """The colour set with every answer "red": a warm start learns to answer it everywhere."""
    write_colour_set(root, n=24, n_test=8)
    for split in ("train", "test"):
        path = root / "records" / f"{split}.jsonl"
        rows = [{**json.loads(line), "target": "red"} for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_harness("manifest", str(root), module="harness.data")
    assert proc.returncode == 0, proc.stderr
    return root


def test_a_warm_start_at_the_ceiling_is_named(tmp_path):
    data = _all_red(tmp_path / "red")
    out = tmp_path / "out"
    proc = run_harness(*CHEAP, "data=jsonl", f"data.path={data}", "budget.sft_warm_start_steps=30",
                       "budget.max_completion_tokens=512", f"output_root={out}", timeout=600, env=PINNED)
    assert proc.returncode == 0, proc.stderr[-4000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("[harness] NOTHING LEFT TO LEARN:")]
    assert len(said) == 2, proc.stderr[-3000:]  # when the eval before is read, and in the end-of-run summary
    assert "already answers every one of the 8 test views correctly (accuracy 1.000)" in said[0]
    assert said.index(said[0]) == 0 and proc.stderr.index(said[0]) < proc.stderr.index("[harness] step 1 |")
    comp = json.loads((run_dir_of(out, "grpo") / "completion.json").read_text())
    ceiling = comp["learning_signal"]["eval_before_at_ceiling"]
    assert ceiling["accuracy"] == 1.0 and ceiling["n"] == 8 and ceiling["split"] == "test"
    assert ceiling["fix"].startswith("fix: evaluate on a harder split")


def test_a_log_file_holds_whole_lines(scratch):
    """stderr to a file (here: a pipe): no progress-bar frames glued onto the [harness] step lines."""
    _, stderr = scratch
    assert "\r" not in stderr and "sampled tokens:" not in stderr
    assert all(line.startswith("[harness]") or "[harness]" not in line for line in stderr.splitlines())
