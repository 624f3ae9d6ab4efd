"""The learning-signal monitor's decisions (harness.run.learning), on hand-made trace rows."""

from __future__ import annotations

from harness.run.learning import Monitor, RoundStats, at_ceiling, no_update_cause, rounds_of_rows, summary


def rows(step: int, groups: list[list[float]], *, well_formed: bool = True, rank_offset: int = 0) -> list[dict]:
    """Trace rows of one round: group g's completion i has reward groups[g][i]."""
    return [{"completion_id": f"abcd1234:{step}:{g + rank_offset}:{i}", "reward": r, "step": step,
             "parser_error": None if well_formed else "unbalanced_tags", "correct": r >= 1.0, "truncated": False}
            for g, rs in enumerate(groups) for i, r in enumerate(rs)]


FLAT = [[0.0, 0.0], [1.0, 1.0]]
MIXED = [[0.0, 1.0], [1.0, 1.0]]


def monitor(window=2, schema=True, terms=()):
    return Monitor(window, schema_reward=schema, arm="grpo", extra_terms=list(terms))


def test_a_group_is_flat_when_all_its_rewards_are_equal():
    r = RoundStats.of_rows(0, rows(0, [[0.5, 0.5, 0.5], [0.0, 1.0, 1.0], [1.0, 1.0 + 1e-12, 1.0]]))
    assert (r.groups, r.flat_groups, r.completions) == (3, 2, 9)
    assert no_update_cause(r, True) is None  # one group disagrees: its advantages move the policy
    assert no_update_cause(RoundStats.of_rows(0, rows(0, FLAT)), True) == "flat_groups"


def test_ranks_merge_to_the_round_of_all_their_rows():
    a, b = rows(4, [[0.0, 1.0]]), rows(4, [[0.5, 0.5], [0.2, 0.2]], rank_offset=1)
    merged = RoundStats.merge([RoundStats.of_rows(4, a), RoundStats.of_rows(4, b)])
    whole = RoundStats.of_rows(4, a + b)
    assert merged == whole
    assert abs(merged.reward_std - 0.32146) < 1e-4 and merged.flat_share == 2 / 3


def test_no_well_formed_answer_is_a_cause_only_for_the_schema_reward():
    r = RoundStats.of_rows(0, rows(0, MIXED, well_formed=False))
    assert no_update_cause(r, schema_reward=True) == "no_well_formed"
    assert no_update_cause(r, schema_reward=False) is None  # a reward of one's own may score other formats


def test_the_finding_comes_once_when_the_window_fills_and_covers_the_whole_stretch():
    mon = monitor(window=2)
    assert mon.observe(RoundStats.of_rows(0, rows(0, MIXED))) is None
    assert mon.observe(RoundStats.of_rows(1, rows(1, FLAT))) is None
    found = mon.observe(RoundStats.of_rows(2, rows(2, FLAT)))
    assert found["since_step"] == 2 and found["rounds"] == 2 and found["cause"] == "flat_groups"
    assert mon.observe(RoundStats.of_rows(3, rows(3, FLAT))) is None  # said once
    assert mon.observe(RoundStats.of_rows(4, rows(4, MIXED))) is None
    end = mon.end()
    assert (end["since_step"], end["until_step"], end["rounds"], end["recovered_at"]) == (2, 4, 3, 5)


def test_an_interrupted_stretch_shorter_than_the_window_is_no_finding():
    mon = monitor(window=3)
    for step, groups in enumerate([FLAT, FLAT, MIXED, FLAT, FLAT]):
        assert mon.observe(RoundStats.of_rows(step, rows(step, groups))) is None
    assert mon.end() is None


def test_a_run_shorter_than_the_window_without_any_signal_is_a_finding_at_its_end():
    mon = monitor(window=8)
    for step in range(3):
        assert mon.observe(RoundStats.of_rows(step, rows(step, FLAT))) is None
    assert mon.end()["rounds"] == 3


def test_the_text_names_the_cause_and_what_moves_the_policy():
    r = [RoundStats.of_rows(s, rows(s, [[-0.5, -0.5]], well_formed=False)) for s in range(2)]
    text = summary(r, 2, schema_reward=True, arm="grpo", extra_terms=[])["no_update"]["text"]
    assert "not one of the 4 completions of 2 generation rounds from step 1 was a well-formed answer" in text
    assert "unbalanced_tags 100%" in text and "every completion got reward -0.500" in text
    assert "grpo's loss has no other term, so its gradient is 0" in text
    solved = [RoundStats.of_rows(s, rows(s, [[1.0, 1.0]])) for s in range(2)]
    found = summary(solved, 2, schema_reward=True, arm="papo", extra_terms=["KL_prcp (arm.gamma)"])["no_update"]
    assert "every completion is correct: nothing is left to learn" in found["text"]
    assert "only KL_prcp (arm.gamma) of papo move it" in found["text"]
    assert found["fix"].startswith("fix: harder training data")


def test_summary_of_the_trace_rows_of_a_run():
    rs = rounds_of_rows(rows(1, FLAT) + rows(0, MIXED))  # any order
    out = summary(rs, 4, schema_reward=True, arm="grpo", extra_terms=[])
    assert [r.step for r in rs] == [0, 1] and out["rounds"] == 2 and out["flat_groups"] == 0.75
    assert out["no_update"] is None  # round 0 had signal


def test_the_ceiling_is_every_view_correct():
    assert at_ceiling({"accuracy": 1.0, "n": 64, "split": "test"})["text"].startswith(
        "the policy RL starts from already answers every one of the 64 test views correctly")
    assert at_ceiling({"accuracy": 0.99, "n": 64}) is None
    assert at_ceiling(None) is None and at_ceiling({"accuracy": 1.0, "n": 0}) is None


def test_which_terms_move_the_policy_without_the_reward():
    from arms.evi_po.config import EviPoArm
    from arms.grpo.config import GrpoArm
    from arms.opd.config import OpdArm
    from arms.papo.config import PapoArm

    assert GrpoArm(name="grpo").reward_free_terms() == []
    assert GrpoArm(name="grpo", beta=0.04).reward_free_terms() == ["the KL to the reference (arm.beta)"]
    assert PapoArm(name="papo").reward_free_terms() == ["KL_prcp (arm.gamma)"]
    assert PapoArm(name="papo", gamma=0.0).reward_free_terms() == []
    assert EviPoArm(name="evi_po", lambda_evidence=0.0).reward_free_terms() == [
        "the direction term (arm.lambda_direction)"]
    assert OpdArm(name="opd").reward_free_terms() is None  # the monitor does not apply


def test_a_resumed_monitor_seeded_from_the_traces_judges_as_an_uninterrupted_one(tmp_path):
    """Resume equals no resume: the monitor of a run resumed from checkpoint-3 is seeded from the trace rows of the
    rounds before step 3 of every rank. Rank 1's file still holds rows of the round at step 3 (past the checkpoint's
    frontier: only rank 1 truncates its own file when it reopens it); they must not count, that round is sampled
    again after the resume."""
    import json

    from harness.accounting.logs import trace_path
    from harness.run.learning import trace_rows

    plan = [MIXED, FLAT, FLAT, FLAT, FLAT, MIXED]  # per step; rank 0 holds group slot 0.., rank 1 slots 2..
    by_rank = {r: [row for s, g in enumerate(plan) for row in rows(s, g, rank_offset=2 * r)] for r in (0, 1)}
    straight = monitor(window=3)
    for s in range(len(plan)):
        straight.observe(RoundStats.of_rows(s, [x for r in (0, 1) for x in by_rank[r] if x["step"] == s]))
    for r, rs in by_rank.items():  # on disk at the resume: rank 0 truncated to the checkpoint, rank 1 not yet
        path = tmp_path / trace_path(r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(x) + "\n" for x in rs if r == 1 or x["step"] < 3))
    resumed = monitor(window=3)
    for rnd in rounds_of_rows(trace_rows(tmp_path, 2, before_step=3)):
        resumed.observe(rnd)
    assert resumed.seen == 3
    for s in range(3, len(plan)):
        resumed.observe(RoundStats.of_rows(s, [x for r in (0, 1) for x in by_rank[r] if x["step"] == s]))
    assert resumed.end() == straight.end() and straight.end()["rounds"] == 4


def test_a_round_is_observed_once_across_the_step_ends_that_train_on_it():
    """steps_per_generation > 1: the reward function leaves one round in ctx.round_rows, and several optimizer
    steps end before the next round is sampled. The monitor observes it at the first of them only (its
    Monitor.last_step); the next round, sampled later, is observed again. A monitor seeded from the traces up to
    step s (a resume) has seen the rounds before s, not the one at s: that one is sampled again and observed."""
    from types import SimpleNamespace

    from harness.run.learning import observe_round

    ctx = SimpleNamespace(round_rows=None, signal=monitor(window=2), signal_metrics=None)
    assert observe_round(ctx) is None and ctx.signal.seen == 0  # no round sampled yet
    ctx.round_rows = (0, rows(0, FLAT))
    for _ in range(3):  # three step ends on the round sampled at step 0
        assert observe_round(ctx) is None
    assert ctx.signal.seen == 1 and ctx.signal.last_step == 0
    assert ctx.signal_metrics["signal/no_update"] == 0  # no finding yet: the window is 2
    ctx.round_rows = (3, rows(3, FLAT))
    found = observe_round(ctx)
    assert found is not None and (found["since_step"], found["rounds"]) == (1, 2)  # the window filled once
    assert observe_round(ctx) is None and ctx.signal.seen == 2  # not again at the next step end
    assert ctx.signal_metrics["signal/no_update"] == 1

    resumed = monitor(window=2)  # resumed at step 3: seeded with the round at step 0 only
    resumed.observe(RoundStats.of_rows(0, rows(0, FLAT)))
    ctx2 = SimpleNamespace(round_rows=(3, rows(3, FLAT)), signal=resumed, signal_metrics=None)
    assert observe_round(ctx2) == found and resumed.seen == 2
