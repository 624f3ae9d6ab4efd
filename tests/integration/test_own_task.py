"""Your own task end to end (issue 36): a 40-row dataset made with PIL and sealed by `python -m harness.data
manifest`, trained at debug=tiny with the built-in reward (it learns: the warm start writes the format, GRPO sees
reward differences), and with a reward function from a file outside the package (grpo and papo): the trace's
rewards are the function's outputs, eval scores with it, an edited file trains as a new run beside the old one, a
function that raises leaves the run failed and resumable, and a warm start too short to teach the format stops
the run before RL with the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import PINNED, run_dir_of, run_harness
from tests.own_data import write_colour_set

REWARD = '''"""A test's reward: colour match in the answer tags, logged call by call to $REWARD_LOG."""
import json, os, re


def colour(prompts, completions, completion_ids, target, trainer_state=None, bonus=0.0, **kwargs):
    step = trainer_state.global_step if trainer_state is not None else None
    if os.environ.get("REWARD_FAIL_AT") == str(step):
        raise ConnectionError("the judge service is down")
    out = []
    for c, t in zip(completions, target):
        m = re.fullmatch(r"<answer>(.*)</answer>", c[0]["content"].strip())
        out.append((1.0 if m and m.group(1).strip().lower() == t else 0.0) + bonus)
    if os.environ.get("REWARD_LOG"):
        with open(os.environ["REWARD_LOG"], "a") as fh:
            fh.write(json.dumps({"step": step, "keys": kwargs["key"], "out": out}) + "\\n")
    return out


def short(prompts, completions, completion_ids, **kwargs):
    return [-len(ids) / 16 for ids in completion_ids]
'''


class Own:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.data = write_colour_set(tmp / "mine")
        proc = run_harness("manifest", str(self.data), module="harness.data")  # no --fill-digests: it fills them
        assert proc.returncode == 0, proc.stderr
        self.reward_file = tmp / "elsewhere" / "my_reward.py"
        self.reward_file.parent.mkdir()
        self.reward_file.write_text(REWARD)
        self.custom = [f"reward._target_={self.reward_file}:colour", "+reward.kwargs.bonus=0.25",
                       f"+reward.components.short={{_target_: '{self.reward_file}:short', weight: 0.05}}"]
        self.out = tmp / "out"
        self.builtin = self.run(self.out)
        assert self.builtin.returncode == 0, self.builtin.stderr[-4000:]
        self.logs = {}
        for arm in ("grpo", "papo"):
            self.logs[arm] = tmp / f"{arm}.log"
            proc = self.run(self.out, f"arm={arm}", *self.custom, env={"REWARD_LOG": str(self.logs[arm])})
            assert proc.returncode == 0, proc.stderr[-4000:]

    def run(self, out: Path, *extra: str, env: dict | None = None):
        return run_harness("debug=tiny", "data=jsonl", f"data.path={self.data}", f"output_root={out}", *extra,
                           timeout=600, env={**PINNED, **(env or {})})

    def run_dir(self, arm: str, custom: bool) -> Path:
        dirs = [p for p in (self.out / "runs").iterdir() if p.name.startswith(arm + "-")
                and (json.loads((p / "run_manifest.json").read_text())["plan"]["config"]["reward"]["_target_"]
                     != "harness.rewards:answer_reward") == custom]
        (d,) = dirs
        return d


@pytest.fixture(scope="module")
def own(tmp_path_factory) -> Own:
    return Own(tmp_path_factory.mktemp("own"))


def test_the_new_user_sequence_learns(own):
    """40 rows, debug=tiny, the built-in reward: the warm start covers the 32 training rows 30 times and writes the
    answer format; GRPO then sees different rewards within a group and updates the policy."""
    assert "the SFT warm start writes a well-formed answer on" in own.builtin.stderr
    sft = run_dir_of(own.out, "sft")
    assert json.loads((sft / "eval/test.json").read_text())["format_valid"] >= 0.5
    rows = list(read_rows(own.run_dir("grpo", custom=False) / "metrics.jsonl"))
    assert any(r.get("reward_std", 0) > 0 for r in rows), rows
    assert any(r.get("grad_norm", 0) > 0 for r in rows)
    # one warm start serves every run of the dataset (the reward is not the warm start's)
    assert len([p for p in (own.out / "runs").iterdir() if p.name.startswith("sft-")]) == 1


@pytest.mark.parametrize("arm", ["grpo", "papo"])
def test_your_reward_is_what_the_run_trains_and_evaluates_on(own, arm):
    run = own.run_dir(arm, custom=True)
    assert verify(run) == []
    calls = [json.loads(line) for line in own.logs[arm].read_text().splitlines()]
    train = [c for c in calls if c["step"] is not None]
    trace = list(read_rows(run / "traces/rank-0.jsonl"))
    assert [t["view"] for t in trace] == [k for c in train for k in c["keys"]]
    assert [t["components"]["colour"] for t in trace] == [v for c in train for v in c["out"]]
    for t in trace:
        assert t["reward"] == t["components"]["colour"] + t["components"]["short"]
        assert t["correct"] == (t["components"]["colour"] >= 1.0)  # reward.success_threshold
    assert {t["components"]["colour"] for t in trace} >= {0.25, 1.25}  # kwargs reached it; both outcomes sampled
    ledger = list(read_rows(run / "ledgers/rank-0.jsonl"))
    assert [r["completion_id"] for r in ledger] == [t["completion_id"] for t in trace]
    for t, r in zip(trace, ledger):  # the shaping term is the ledger's own token count
        assert t["components"]["short"] == pytest.approx(-0.05 * r["tokens"] / 16)
    # eval before and after scored with the function (the warm start's built-in eval was not reused)
    evals = [c for c in calls if c["step"] is None]
    assert len(evals) == 2 and all(len(c["out"]) == 8 for c in evals)
    after = [json.loads(line) for line in (run / "eval/test.predictions.jsonl").read_text().splitlines()]
    assert [p["reward"] for p in after] == pytest.approx([v + 0.05 * (-p["tokens"] / 16)
                                                          for v, p in zip(evals[-1]["out"], after)])
    result = json.loads((run / "eval/test.json").read_text())
    assert result["accuracy"] == sum(v >= 1.0 for v in evals[-1]["out"]) / 8
    assert json.loads((run / "eval/test-before.json").read_text()).get("reused_from") is None


def _files(run: Path) -> dict:
    return {str(p.relative_to(run)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run.rglob("*")) if p.is_file()}


def test_an_edited_reward_is_a_new_run_and_the_old_one_is_untouched(own, tmp_path):
    """The run name carries the reward's code digest: a comment edit finds the trained run (complete, exit 0); an edit
    of the code trains a new run beside it (exit 0), from the same warm start, and leaves the old run as it was."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    sft, old = run_dir_of(own.out, "sft"), own.run_dir("grpo", custom=True)
    for d in (sft, old):
        shutil.copytree(d, out / "runs" / d.name)
    old = out / "runs" / old.name
    original = own.reward_file.read_text()
    try:
        own.reward_file.write_text(original + "\n# tuned the bonus\n")
        commented = own.run(out, "arm=grpo", *own.custom)
        assert commented.returncode == 0, commented.stderr[-3000:]
        assert f"run {old.name} is already complete" in commented.stderr  # the trained run, found: no new one
        assert sorted(p.name for p in (out / "runs").iterdir()) == sorted([sft.name, old.name])
        before = _files(old)
        own.reward_file.write_text(original.replace("else 0.0) + bonus", "else 0.0) + 2 * bonus"))
        edited = own.run(out, "arm=grpo", *own.custom)
    finally:
        own.reward_file.write_text(original)
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert "ResumeMismatchError" not in edited.stderr
    (new,) = [p for p in (out / "runs").iterdir() if p.name not in (sft.name, old.name)]
    assert new.name.split("-")[3] != old.name.split("-")[3] and new.name.split("-")[3].startswith("colour_")
    assert new.name.rsplit("-", 1)[1] == old.name.rsplit("-", 1)[1]  # the same config: only the reward's code differs
    assert verify(new) == [] and _files(old) == before
    manifest = json.loads((new / "run_manifest.json").read_text())
    assert manifest["identity"]["reward"]["code_sha256"][:8] == new.name.split("-")[3].rsplit("_", 1)[1]
    assert {t["components"]["colour"] for t in read_rows(new / "traces/rank-0.jsonl")} <= {0.5, 1.5}  # 2 x the bonus


def test_a_raising_reward_leaves_the_run_failed_and_resumable(own, tmp_path):
    """The function raises at step 3 (a checkpoint at step 2 exists): exit 11 with its traceback once, status failed,
    no ledger row of step 3; the same command resumes and ends exactly as the run that never failed."""
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    sft = run_dir_of(own.out, "sft")
    shutil.copytree(sft, out / "runs" / sft.name)
    proc = own.run(out, "arm=grpo", *own.custom, env={"REWARD_FAIL_AT": "3"})
    assert proc.returncode == 11, proc.stderr[-3000:]
    assert proc.stderr.count("Traceback") == 1 and "the judge service is down" in proc.stderr
    assert f"reward._target_={own.reward_file}:colour raised ConnectionError" in proc.stderr
    run = run_dir_of(out, "grpo")
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "failed"
    assert {r["step"] for r in read_rows(run / "ledgers/rank-0.jsonl")} <= {0, 1, 2}
    again = own.run(out, "arm=grpo", *own.custom)
    assert again.returncode == 0, again.stderr[-3000:]
    assert verify(run) == []
    ref = own.run_dir("grpo", custom=True)
    rows = lambda d: [(r["completion_id"], r["reward"]) for r in read_rows(d / "traces/rank-0.jsonl")]  # noqa: E731
    assert rows(run) == rows(ref)
    assert (run / "final_policy/model.safetensors").read_bytes() == (ref / "final_policy/model.safetensors").read_bytes()


def test_a_warm_start_that_does_not_teach_the_format_stops_the_run(own, tmp_path):
    proc = own.run(tmp_path / "out", "budget.sft_warm_start_steps=1")
    assert proc.returncode == 10, proc.stderr[-3000:]
    assert "WarmStartError" in proc.stderr and "budget.sft_warm_start_steps=1" in proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name.split("-")[0] for p in (tmp_path / "out" / "runs").iterdir()] == ["sft"]  # no RL run dir


def test_a_multi_pass_warm_start_paused_mid_pass_continues_to_the_same_policy(own, tmp_path):
    """The warm start of the 32 training rows trains 60 steps over 30 passes, each in a fresh seeded order. Its own
    command line (the plan's overrides) paused at step 25, inside a pass, then run again without the pause, is the
    same run (its name) and ends with the very weights and logged values of the warm start that never stopped."""
    from tests.conftest import logged_values

    straight = run_dir_of(own.out, "sft")
    plan = json.loads((straight / "run_manifest.json").read_text())["plan"]
    assert plan["budget"]["epochs"] > 1 and "arm.epochs=null" in plan["overrides"]  # several passes
    out = tmp_path / "out"
    line = [o for o in plan["overrides"] if not o.startswith("output_root=")]
    line += [f"output_root={out}", f"model.cache_dir={own.out / 'cache' / 'models'}"]
    paused = run_harness(*line, "budget.stop_after_steps=25", timeout=600, env=PINNED)
    assert paused.returncode == 0, paused.stderr[-3000:]
    run = run_dir_of(out, "sft")
    assert run.name == straight.name
    assert json.loads((run / "run_manifest.json").read_text())["status"] == "paused"
    again = run_harness(*line, timeout=600, env=PINNED)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume audit passed: checkpoint-25" in again.stderr
    assert verify(run) == []
    assert logged_values(run) == logged_values(straight)
    weights = "final_policy/model.safetensors"
    assert (run / weights).read_bytes() == (straight / weights).read_bytes()
