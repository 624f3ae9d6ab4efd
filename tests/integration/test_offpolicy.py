"""Off-policy rounds end to end (rollout=async, harness.offpolicy): the debug=tiny grpo run from this session's warm
start (tests/conftest.py's `tiny`), its rounds sampled by a separate sampler process.

- lag=1: a SIGKILL of the trainer at a random step while its sampler is killed every third round (restarted), then
  the same command, equals the uninterrupted run bit for bit (weights, ledger, trace, logged values), the buffer
  rolled back to the checkpoint: the killed run's part before the kill is the same command run a second time; so
  does a run whose sampler keeps dying (exit 13, slow) run again; verify and the report read every completion's
  policy age.
- lag=0: every importance weight is exactly 1 and every age 0, and each step trains the prompts the synchronous
  run trains (its completions differ: the sampler's RNG is seeded per round, the trainer's is one stream).
- lag=2 (slow): twice the same, each completion's age min(round, 2).
- free running (lag=null, cap 2): killed at a random step, the same command replays the rounds the buffer holds
  (the killed run's ledger is a prefix of the finished one's) and goes on; every age within the cap, under the
  budget, verify clean.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
from collections import defaultdict
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import logged_values, run_dir_of


def async_run(tiny, out: Path, *extra: str, fault: str | None = None):
    return tiny.run(out, "rollout=async", *extra, fault=fault)


@pytest.fixture(scope="module")
def lag1(tiny, tmp_path_factory) -> Path:
    """The uninterrupted lag-1 run (the reference of this module's lag-1 cases)."""
    out = tiny.case(tmp_path_factory.mktemp("lag1") / "out")
    proc = async_run(tiny, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir_of(out, "grpo")


def assert_same_run(a: Path, b: Path) -> None:
    """Two finished runs trained the same: verify clean, the same final weights, ledger, trace (provenance aside)
    and logged values."""
    assert verify(b) == [], verify(b)
    assert (a / "final_policy/model.safetensors").read_bytes() == (b / "final_policy/model.safetensors").read_bytes()
    assert (a / "ledgers/rank-0.jsonl").read_bytes() == (b / "ledgers/rank-0.jsonl").read_bytes()
    trace = lambda d: [{k: v for k, v in r.items() if k != "provenance"} for r in read_rows(d / "traces/rank-0.jsonl")]  # noqa: E731
    assert trace(a) == trace(b)
    assert logged_values(a) == logged_values(b)


def test_lag1_records_every_completions_version_age_and_weight(lag1):
    assert verify(lag1) == []
    rows = list(read_rows(lag1 / "ledgers/rank-0.jsonl"))
    assert {(r["step"], r["policy_version"], r["policy_age"]) for r in rows} == {
        (s, max(0, s - 1), min(s, 1)) for s in range(rows[-1]["step"] + 1)}
    weights = [r["is_weight"] for r in read_rows(lag1 / "traces/rank-0.jsonl")]
    assert all(w["min"] == w["max"] == 1.0 for w in weights[:32])  # round 0: sampled by the weights that train it
    assert any(w["mean"] != 1.0 for w in weights[32:])  # later rounds: one step behind, corrected
    log = (lag1 / "offpolicy/sampler.log").read_text()
    assert "round 1 by version 0" in log and "round 2 by version 1" in log


def test_verify_and_the_report_read_the_ages(lag1, tmp_path):
    """The report's off-policy table gives the run's mean age and weight drift; verify names a completion whose
    recorded version does not fit the lag."""
    from harness.report.cli import build_report

    steps = max(r["step"] for r in read_rows(lag1 / "ledgers/rank-0.jsonl")) + 1
    rep, md = build_report(lag1.parent, "grpo", tmp_path / "report", None)
    text = Path(md).read_text()
    assert "Off-policy rounds" in text, text
    (row,) = [line for line in text.splitlines() if line.startswith("| grpo") and "Off-policy" not in line
              and f"{(steps - 1) / steps:.3f}" in line]
    copy = tmp_path / lag1.name
    shutil.copytree(lag1, copy)
    ledger = copy / "ledgers/rank-0.jsonl"
    lines = ledger.read_text().splitlines()
    lines[40] = lines[40].replace('"policy_version":0', '"policy_version":1')  # step 1: sampled by version 0
    ledger.write_text("\n".join(lines) + "\n")
    assert verify(copy) == [f"rank-0.jsonl: {json.loads(lines[40])['completion_id']} trained at round 1 was sampled by "
                            "version 1 (age 1); rollout.lag=1, rollout.max_policy_age=4"]


def test_sigkill_of_the_trainer_while_its_sampler_dies_every_third_round_equals_the_uninterrupted_run(
        tiny, lag1, tmp_path):
    """Both faults in one run: the sampler dies after every third round it samples (each start counts its own) and
    is restarted where the trainer waits; the trainer is SIGKILLed after a random step (after the first restart);
    the same command then resumes, the buffer rolled back to the checkpoint, and equals the uninterrupted run."""
    step = random.Random().randint(4, 7)  # a random point, named in the failure
    out = tiny.case(tmp_path / "out")
    killed = async_run(tiny, out, fault=f"rl.step@{step}:kill;sampler.round@3:kill")
    assert killed.returncode == -signal.SIGKILL, f"not killed after step {step}: {killed.stderr[-3000:]}"
    assert killed.stderr.count("restarting it there") >= 1, killed.stderr[-3000:]  # rounds 0-2, then from 3
    again = async_run(tiny, out)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "restarting it there" not in again.stderr
    run = run_dir_of(out, "grpo")
    starts = (run / "offpolicy/sampler.log").read_text().count("--- sampler from round")
    assert starts == killed.stderr.count("restarting it there") + 2, f"killed after step {step}"  # + first, resume
    assert_same_run(lag1, run)


@pytest.mark.slow
def test_a_sampler_that_keeps_dying_ends_the_run_with_exit_13_then_the_same_command_resumes(tiny, lag1, tmp_path):
    out = tiny.case(tmp_path / "out")
    proc = async_run(tiny, out, fault="sampler.round@1:kill")
    assert proc.returncode == 13, proc.stderr[-4000:]
    assert "SamplerGone: the off-policy sampler process exited with code -9" in proc.stderr
    assert "Traceback" not in proc.stderr
    again = async_run(tiny, out)
    assert again.returncode == 0, again.stderr[-4000:]
    assert_same_run(lag1, run_dir_of(out, "grpo"))


def test_lag0_weights_are_one_and_each_step_trains_the_synchronous_runs_prompts(tiny, tmp_path):
    out = tiny.case(tmp_path / "out")
    proc = async_run(tiny, out, "rollout.lag=0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_dir_of(out, "grpo")
    assert verify(run) == []
    traced = list(read_rows(run / "traces/rank-0.jsonl"))
    assert {(r["policy_age"], r["is_weight"]["min"], r["is_weight"]["max"]) for r in traced} == {(0, 1.0, 1.0)}
    views = lambda d: {s: v for s, v in _views_per_step(d).items()}  # noqa: E731
    mine, sync = views(run), views(tiny.grpo)
    common = sorted(set(mine) & set(sync))
    assert len(common) >= 4 and all(mine[s] == sync[s] for s in common), (mine, sync)


def test_lora_versions_are_the_adapter_and_the_sampler_samples_with_the_trained_one(tiny, tmp_path):
    """model.tuning=lora through the async path: each published version holds the adapter only, and at lag 0 every
    importance weight is exactly 1 while the adapter changes from version to version, so the sampler generated
    every round with the adapter the trainer had (with a stale one the weights move: 0.88-0.94 at lag 1 in the
    same setting). From the base model (arm.init=scratch), with a length reward: a signal from the first step."""
    (tmp_path / "length.py").write_text(
        "def length_reward(prompts, completions, **kwargs):\n"
        "    return [len(c[0]['content']) / 64.0 for c in completions]\n")
    out = tmp_path / "out"
    proc = async_run(tiny, out, "rollout.lag=0", "model.tuning=lora", "arm.init=scratch",
                     f"reward._target_={tmp_path / 'length.py'}:length_reward")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_dir_of(out, "grpo")
    assert verify(run) == []
    traced = list(read_rows(run / "traces/rank-0.jsonl"))
    assert {(r["policy_age"], r["is_weight"]["min"], r["is_weight"]["max"]) for r in traced} == {(0, 1.0, 1.0)}
    assert len({r["step"] for r in traced}) >= 3
    from safetensors.torch import load_file

    versions = [load_file(p) for p in sorted((run / "offpolicy" / "policy").glob("version-*.safetensors"))]
    assert len(versions) >= 2 and all(k.endswith("lora_A.default.weight") or k.endswith("lora_B.default.weight")
                                      for k in versions[0])
    first, last = versions[0], versions[-1]
    assert any(not first[k].equal(last[k]) for k in first), "the adapter never changed: the test shows nothing"


def _views_per_step(run: Path) -> dict:
    out = defaultdict(list)
    for r in read_rows(run / "ledgers/rank-0.jsonl"):
        out[r["step"]].append(r["view"])
    return dict(out)


@pytest.mark.slow
def test_lag2_twice_is_the_same_run_with_ages_up_to_two(tiny, tmp_path):
    runs = []
    for name in ("a", "b"):
        out = tiny.case(tmp_path / name)
        proc = async_run(tiny, out, "rollout.lag=2")
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(run_dir_of(out, "grpo"))
    assert_same_run(*runs)
    ages = {(r["step"], r["policy_age"]) for r in read_rows(runs[0] / "ledgers/rank-0.jsonl")}
    assert ages == {(s, min(s, 2)) for s, _ in ages}
    completion = json.loads((runs[0] / "completion.json").read_text())
    assert completion["realized_completion_tokens"] <= completion["completion_token_ceiling"]


def test_free_running_killed_and_resumed_replays_its_buffer_keeps_every_age_within_the_cap(tiny, tmp_path):
    step = random.Random().randint(3, 6)  # a random point, named in the failure
    out = tiny.case(tmp_path / "out")
    free = ("rollout.lag=null", "rollout.max_policy_age=2")
    killed = async_run(tiny, out, *free, fault=f"rl.step@{step}:kill")
    assert killed.returncode == -signal.SIGKILL, f"not killed after step {step}: {killed.stderr[-3000:]}"
    run = run_dir_of(out, "grpo")
    before = (run / "ledgers/rank-0.jsonl").read_bytes()
    assert before.count(b"\n") == 32 * step  # steps 0 .. step-1, 32 completions each
    again = async_run(tiny, out, *free)
    assert again.returncode == 0, again.stderr[-4000:]
    assert verify(run) == [], verify(run)
    after = (run / "ledgers/rank-0.jsonl").read_bytes()
    assert after.startswith(before), f"killed after step {step}: the resumed run did not replay the buffer's rounds"
    rows = list(read_rows(run / "ledgers/rank-0.jsonl"))
    assert {r["policy_age"] for r in rows} <= {0, 1, 2} and rows[0]["policy_age"] == 0
    assert all(r["policy_age"] == r["step"] - r["policy_version"] for r in rows)
    from harness.offpolicy.buffer import read_round

    versions = {r["step"]: r["policy_version"] for r in rows}
    assert versions == {s: read_round(run, s).version for s in versions}  # what the buffer says sampled each round
    completion = json.loads((run / "completion.json").read_text())
    assert completion["realized_completion_tokens"] <= completion["completion_token_ceiling"]
    assert (run / "offpolicy/sampler.log").read_text().count("--- sampler from round") == 2
