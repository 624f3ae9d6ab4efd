"""Planned stops (harness.halt): a pause at budget.stop_after_steps and a SIGTERM (twice) during training each
publish a checkpoint, mark the run paused / interrupted (not failed), exit 0 / 143, and the same command then
finishes a run identical to one that never stopped: ledger, trace, logged values and final weights, bit for bit.
A SIGTERM during the SFT warm start interrupts it (and the RL run is not started). SIGUSR1 and the hang watchdog
write the stacks and the run goes on. Every start of a run records its start phases.

The pause and its continuation are in the default suite (from the session's debug=tiny warm start, compared with
its grpo run: tests/conftest.py); the signals are slow tests."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import PINNED, logged_values, run_harness, signal_harness

ENV = PINNED  # the same kernels in every run, so the continued run can match bit for bit
ARGS = ["debug=tiny"]  # grpo from a 60-step warm start, ~8 steps, a checkpoint every 2


def _grpo_dir(out: Path) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith("grpo-")]
    return d


def _manifest(run: Path) -> dict:
    return json.loads((run / "run_manifest.json").read_text())


@pytest.fixture(scope="module")
def paused(tiny, tmp_path_factory):
    """Paused at step 3, asked again (it stays paused), then continued without the pause; from a copy of the
    session's debug=tiny warm start (tests/conftest.py), whose grpo run is the one that never stopped (~20 s)."""
    out = tiny.case(tmp_path_factory.mktemp("paused") / "out")
    first = tiny.run(out, "budget.stop_after_steps=3")
    assert first.returncode == 0, first.stderr[-4000:]
    run = _grpo_dir(out)
    result = {"straight": tiny.grpo, "manifest": _manifest(run),
              "checkpoints": sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*")),
              "permanent": json.loads((run / "checkpoints/checkpoint-3" / CHECKPOINT_MANIFEST).read_text())[
                  "permanent"],
              "completion": (run / "completion.json").exists(), "verify": verify(run)}
    again = tiny.run(out, "budget.stop_after_steps=3")
    assert again.returncode == 0, again.stderr[-4000:]
    result["again"] = again.stderr
    result["again_checkpoints"] = sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*"))
    cont = tiny.run(out)
    assert cont.returncode == 0, cont.stderr[-4000:]
    result["continue"], result["run"] = cont.stderr, run
    return result


@pytest.fixture(scope="module")
def interrupted(tiny, tmp_path_factory):
    """SIGTERM twice after checkpoint 2, then the same command; from a copy of the session's warm start."""
    out = tiny.case(tmp_path_factory.mktemp("interrupted") / "out")
    code, stderr = signal_harness(*ARGS, f"output_root={out}", *tiny.cache, when="checkpoint 2 published",
                                  signals=(signal.SIGTERM, signal.SIGTERM), env=ENV)
    run = _grpo_dir(out)
    result = {"straight": tiny.grpo, "code": code, "stderr": stderr, "manifest": _manifest(run),
              "completion": (run / "completion.json").exists(), "verify": verify(run)}
    cont = tiny.run(out)
    assert cont.returncode == 0, cont.stderr[-4000:]
    result["continue"], result["run"] = cont.stderr, run
    return result


def test_a_pause_stops_after_its_step_with_a_resumable_checkpoint(paused):
    m = paused["manifest"]
    assert m["status"] == "paused" and m["halt"] == {"status": "paused", "step": 3, "checkpoint": "checkpoint-3",
                                                     "signal": None, "exit_code": 0}
    assert m["events"][-1]["status"] == "paused" and m["events"][-1]["step"] == 3
    assert paused["checkpoints"] == ["checkpoint-2", "checkpoint-3"]
    assert paused["permanent"] is False  # not the run's final checkpoint: training goes on from it
    assert not paused["completion"] and paused["verify"] == []
    # asked again with the same pause: nothing trains, it stays paused
    assert "it stays paused" in paused["again"] and paused["again_checkpoints"] == paused["checkpoints"]
    assert "resuming from checkpoint-3" in paused["continue"]


@pytest.mark.slow  # ~25 s; the halt decision step by step: tests/unit/test_halt_steps.py
def test_sigterm_finishes_the_step_checkpoints_and_exits_143(interrupted):
    assert interrupted["code"] == 128 + signal.SIGTERM, interrupted["stderr"][-3000:]
    err = interrupted["stderr"]
    assert "SIGTERM: finishing the current step" in err
    assert "ignored until the checkpoint is published" in err  # the second signal did not cut the save short
    m = interrupted["manifest"]
    step = m["halt"]["step"]
    assert m["status"] == "interrupted" and m["halt"]["signal"] == "SIGTERM" and m["halt"]["exit_code"] == 143
    assert step >= 3 and f"checkpoint {step} published" in err  # the step after checkpoint 2 (or the one after)
    assert not interrupted["completion"] and interrupted["verify"] == []
    assert f"resuming from checkpoint-{step}" in interrupted["continue"]


@pytest.mark.parametrize("stopped", ["paused", pytest.param("interrupted", marks=pytest.mark.slow)])
def test_the_continued_run_equals_the_run_that_never_stopped(request, stopped):
    runs = request.getfixturevalue(stopped)
    a, b = runs["straight"], runs["run"]
    assert _manifest(b)["status"] == "completed" and "halt" not in _manifest(b)
    assert verify(b) == []
    ids = lambda run: [(r["completion_id"], r["tokens"]) for r in read_rows(run / "ledgers/rank-0.jsonl")]  # noqa: E731
    rewards = lambda run: [(r["completion_id"], r["reward"]) for r in read_rows(run / "traces/rank-0.jsonl")]  # noqa: E731
    assert ids(b) == ids(a) and rewards(b) == rewards(a)
    assert logged_values(b) == logged_values(a)
    assert (b / "final_policy/model.safetensors").read_bytes() == (a / "final_policy/model.safetensors").read_bytes()
    ca, cb = (json.loads((d / "completion.json").read_text()) for d in (a, b))
    assert cb["optimizer_steps"] == ca["optimizer_steps"] and cb["stopped_by"] == ca["stopped_by"] == "budget"
    audit = json.loads((b / "audits/resume-1-rank-0.json").read_text())
    assert audit["status"] == "passed"


@pytest.mark.slow  # ~30 s: the warm start trained twice
def test_sigterm_during_the_sft_warm_start_interrupts_it_and_the_same_command_finishes_both(tmp_path):
    out = tmp_path / "out"
    code, err = signal_harness(*ARGS, f"output_root={out}", when="step 5/60", signals=(signal.SIGTERM,), env=ENV)
    assert code == 143, err[-3000:]
    (sft,) = (out / "runs").glob("sft-*")
    assert _manifest(sft)["status"] == "interrupted" and not list((out / "runs").glob("grpo-*"))
    again = run_harness(*ARGS, f"output_root={out}", timeout=600, env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _manifest(sft)["status"] == "completed" and _manifest(_grpo_dir(out))["status"] == "completed"


@pytest.mark.slow  # ~25 s; the dumps and the watchdog themselves: tests/unit/test_diagnostics.py
def test_sigusr1_and_the_hang_watchdog_write_stacks_and_the_run_goes_on(tmp_path):
    """SIGUSR1 x3 mid-training: diagnostics/stacks-0-<time>.txt each, with the trainer's frames, and the run completes.
    train.hang_timeout_s shorter than a step: each step "hangs", so hang-0-<time>.txt files are written (with a
    warning) and training still goes on to the end."""
    out = tmp_path / "out"
    args = [*ARGS, "arm.init=scratch", "train.hang_timeout_s=0.05", f"output_root={out}"]
    code, err = signal_harness(*args, when="checkpoint 2 published", signals=(signal.SIGUSR1,) * 3, env=ENV)
    assert code == 0, err[-3000:]
    run = _grpo_dir(out)
    assert _manifest(run)["status"] == "completed"
    dumps = sorted((run / "diagnostics").glob("stacks-0-*.txt"))
    assert len(dumps) == 3  # one per signal (50 ms apart), none of them ending the run
    text = dumps[0].read_text()
    assert "Current thread" in text or "Thread 0x" in text
    assert "transformers/trainer.py" in text  # the main thread, inside the Trainer's loop
    assert "SIGUSR1: every thread's stack written to" in err
    assert list((run / "diagnostics").glob("hang-0-*.txt"))
    assert "no step completed in 0.05 s (train.hang_timeout_s)" in err
    assert verify(run) == []
    # the dumps and the watchdog change nothing: the same run without them (train.hang_timeout_s is not semantic)
    plain = tmp_path / "plain"
    same = run_harness(*ARGS, "arm.init=scratch", f"output_root={plain}", timeout=600, env=ENV)
    assert same.returncode == 0, same.stderr[-3000:]
    ref = _grpo_dir(plain)
    ids = lambda d: [(r["completion_id"], r["tokens"]) for r in read_rows(d / "ledgers/rank-0.jsonl")]  # noqa: E731
    assert ids(run) == ids(ref) and logged_values(run) == logged_values(ref)
    assert (run / "final_policy/model.safetensors").read_bytes() == (ref / "final_policy/model.safetensors").read_bytes()


def test_every_start_of_a_run_records_its_start_phases(paused):
    """The manifest's start_phases: one entry per process start (a pause, a no-op start that stays paused, the
    continuation), each the seconds from that start to the end of each phase and to its first optimizer step;
    completion.json's start_phases_s is the last start's."""
    order = ["parent", "imports", "data", "model", "eval_before", "first_step", "train", "eval_after", "finalize"]
    straight = _manifest(paused["straight"])["start_phases"]
    assert len(straight) == 1
    (marks,) = [s["seconds"] for s in straight]
    assert list(marks) == order and list(marks.values()) == sorted(marks.values())
    comp = json.loads((paused["straight"] / "completion.json").read_text())
    assert comp["start_phases_s"] == marks  # finalize: up to completion.json itself
    starts = [s["seconds"] for s in _manifest(paused["run"])["start_phases"]]
    assert len(starts) == 3
    assert "first_step" in starts[0] and "first_step" not in starts[1] and "first_step" in starts[2]
    assert "finalize" not in starts[0] and "finalize" in starts[2]  # the pause ended its start before finalize
