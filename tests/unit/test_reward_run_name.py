"""The reward is part of the run's name, like the data (issue 46): a reward of your own adds
`<function>_<identity.reward.code_sha256[:8]>` after the data, so an edited reward file plans a new run dir instead
of refusing the resume; a comment edit plans the same one; the built-in reward and an SFT warm start add nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.plan import RUN_NAME_HASH_LEN
from harness.rundir import identity_diffs

REWARD = '''
def exact(prompts, completions, completion_ids, target, **kwargs):
    return [1.0 if c[0]["content"] == f"<answer>{t}</answer>" else 0.0 for c, t in zip(completions, target)]


def short(prompts, completions, completion_ids, **kwargs):
    return [-len(ids) / 16 for ids in completion_ids]
'''


@pytest.fixture
def reward(tmp_path) -> Path:
    path = tmp_path / "elsewhere" / "my_reward.py"
    path.parent.mkdir()
    path.write_text(REWARD)
    return path


def test_a_reward_of_your_own_is_in_the_run_name_after_the_data(plan_of, reward):
    builtin = plan_of("debug=tiny")
    plan = plan_of("debug=tiny", f"reward._target_={reward}:exact")
    code = plan.identity["reward"]["code_sha256"]
    sem = plan.identity["semantic_sha256"]
    assert plan.run_name == f"grpo-tiny_vlm-synthetic-exact_{code[:RUN_NAME_HASH_LEN]}-s0-{sem[:RUN_NAME_HASH_LEN]}"
    assert builtin.run_name == "grpo-tiny_vlm-synthetic-s0-6c7a0941"  # the built-in: as pinned (plan_identities.json)
    # the SFT warm start has no reward: one warm start, whatever the reward
    assert plan.parent.run_name == builtin.parent.run_name == "sft-tiny_vlm-synthetic-s0-1df42089"


def test_an_edited_reward_is_a_new_run_and_a_comment_is_the_same(plan_of, reward):
    args = ("debug=tiny", f"reward._target_={reward}:exact")
    before = plan_of(*args)
    reward.write_text(REWARD + "\n# tried a length penalty: too strong\n")
    commented = plan_of(*args)
    assert commented.run_name == before.run_name  # the same run: it resumes, or is found complete
    assert identity_diffs(before.identity, commented.identity) == []
    reward.write_text(REWARD.replace("1.0 if", "2.0 if"))
    edited = plan_of(*args)
    assert edited.run_name != before.run_name and edited.run_dir != before.run_dir  # a new run, the old one untouched
    assert edited.identity["semantic_sha256"] == before.identity["semantic_sha256"]  # only the reward's code changed
    assert edited.parent.run_name == before.parent.run_name


def test_an_edited_component_is_a_new_run(plan_of, reward, tmp_path):
    """The builtin main reward with a component of your own: the name's part is the main function's name with the
    digest over every function."""
    other = tmp_path / "elsewhere" / "penalty.py"
    other.write_text(REWARD)
    args = ("debug=tiny", f"+reward.components.short={{_target_: '{other}:short', weight: 0.05}}")
    before = plan_of(*args)
    assert f"-answer_reward_{before.identity['reward']['code_sha256'][:RUN_NAME_HASH_LEN]}-s0-" in before.run_name
    other.write_text(REWARD.replace("/ 16", "/ 32"))
    assert plan_of(*args).run_name != before.run_name


def test_a_planned_teacher_carries_the_reward_and_its_warm_start_does_not(plan_of, reward):
    """opd with arm.teacher=grpo: the teacher is the grpo run of the same command, reward part included (an edited
    reward trains a new teacher); the warm start is the shared SFT one."""
    args = ("debug=tiny", "arm=opd", "arm.teacher=grpo", f"reward._target_={reward}:exact")
    plan = plan_of(*args)
    grpo = plan_of("debug=tiny", f"reward._target_={reward}:exact")
    assert plan.teacher.run_name == grpo.run_name and "-exact_" in plan.run_name
    assert plan.teacher.parent.run_name == plan.parent.run_name == grpo.parent.run_name
    reward.write_text(REWARD.replace("1.0 if", "2.0 if"))
    assert plan_of(*args).teacher.run_name != grpo.run_name


def test_a_reward_edited_after_the_plan_is_refused_before_it_scores(plan_of, reward):
    """The plan's run name carries the reward's code digest; a file edited between the plan and the run (a SLURM job
    waiting in the queue) would train other code under that name: loading the rewards refuses it, naming the file."""
    from harness.errors import ResumeMismatchError
    from harness.eval.during import plan_rewards

    plan = plan_of("debug=tiny", f"reward._target_={reward}:exact")
    reward.write_text(REWARD + "\n# a comment changes no code\n")
    assert plan_rewards(plan) is not None
    other = plan_of("debug=tiny", f"reward._target_={reward}:exact", "seed=1")  # a plan of its own: loaded afresh
    reward.write_text(REWARD.replace("1.0 if", "2.0 if"))
    with pytest.raises(ResumeMismatchError, match="my_reward.py") as err:
        plan_rewards(other)
    assert "identity.reward.main_code_sha256" in str(err.value)
