"""The report's per-run budget table and the budget-bound verdict (issue 12, item 6): fixture run dirs
with chosen steps and tokens, checked against hand-computed rows and verdict lines."""

from __future__ import annotations

import json

import pytest

from harness.report.cli import build_report, main
from tests.unit.test_report import basic, make_run  # noqa: F401  (basic: a fixture)

# make_run's RL arms: 2 prompts x 4 generations x max_completion_length 16 = 128 tokens per step at most;
# one round = 128 x steps_per_generation. Realized tokens = steps x (30 + 20).
BUDGET = dict(stopped_by="budget", max_steps=100, ceiling=2048)


def _name(p) -> str:
    return p.name  # the fixture's run dir is named after its run


@pytest.fixture
def bound(tmp_path):
    """sft warm starts (s0 ran its 20 max_steps, s1 a shorter epoch prefix), grpo and papo seeds 0, 1 stopped by
    a 2,048-token budget (grpo: 4 steps a round -> 512, papo: 2 -> 256), one incomplete grpo run."""
    root = tmp_path / "out"
    sft = [make_run(root, "sft", 0, 0.4, steps=20, max_steps=20, sft_rows=40),
           make_run(root, "sft", 1, 0.4, steps=12, max_steps=20, sft_rows=24)]
    runs = {
        "grpo0": make_run(root, "grpo", 0, 0.5, steps=32, steps_per_generation=4, parent=sft[0].name, **BUDGET),
        "grpo1": make_run(root, "grpo", 1, 0.6, steps=39, steps_per_generation=4, parent=sft[1].name, **BUDGET),
        "papo0": make_run(root, "papo", 0, 0.55, steps=36, steps_per_generation=2, parent=sft[0].name, **BUDGET),
        "papo1": make_run(root, "papo", 1, 0.65, steps=35, steps_per_generation=2, parent=sft[1].name, **BUDGET),
        "grpo2": make_run(root, "grpo", 2, None, steps_per_generation=4, complete=False, **BUDGET),
        "sft0": sft[0], "sft1": sft[1],
    }
    return root, runs


def test_per_run_rows_in_json(bound):
    root, runs = bound
    rep, _ = build_report(root)
    rows = rep["groups"][0]["budget_runs"]
    # grouped as the conditions are (sft (warm start), grpo, papo), seeds in order, incomplete after the complete
    assert [(r["condition"], r["seed"], r["complete"]) for r in rows] == [
        ("sft (warm start)", 0, True), ("sft (warm start)", 1, True),
        ("grpo", 0, True), ("grpo", 1, True), ("grpo", 2, False),
        ("papo", 0, True), ("papo", 1, True)]
    by = {r["run"]: r for r in rows}
    g0 = by[_name(runs["grpo0"])]
    assert (g0["optimizer_steps"], g0["max_steps"], g0["tokens"], g0["ceiling"]) == (32, 100, 1600, 2048)
    assert g0["fraction"] == pytest.approx(1600 / 2048)
    assert (g0["stopped_by"], g0["round_bound"], g0["budget_kind"]) == ("budget", 512, "sampled")
    assert by[_name(runs["papo1"])]["round_bound"] == 256 and by[_name(runs["papo1"])]["tokens"] == 1750
    s0, s1 = by[_name(runs["sft0"])], by[_name(runs["sft1"])]
    assert (s0["budget_kind"], s0["tokens"], s0["ceiling"], s0["round_bound"]) == ("loss", 500, 2000, None)
    assert s0["stopped_by"] == "max_steps" and s0["stopped_by_recorded"] == "max_steps"  # 20 of max 20 steps
    assert s1["stopped_by"] == "loss-token cap or end of epoch" and s1["sft_rows"] == 24  # 12 of max 20 steps
    inc = by[_name(runs["grpo2"])]
    assert inc["complete"] is False and "no completion.json" in inc["status"]
    assert inc["tokens"] is None and inc["stopped_by"] is None and inc["round_bound"] == 512
    (listed,) = rep["incomplete_runs"]
    assert (listed["group"], listed["condition"]) == (1, "grpo")
    assert json.loads((root / "report" / "report.json").read_text())["groups"][0]["budget_runs"] == rows


def test_verdict_yes(bound, capsys):
    root, _ = bound
    rep, md = build_report(root)
    v = rep["groups"][0]["budget_bound"]
    # realized 1,600 / 1,950 (grpo), 1,800 / 1,750 (papo): spread 350 <= the largest round bound, grpo's 512
    assert v["budget_bound"] is True and v["rl_runs"] == 4 and v["incomplete_rl_runs"] == 1
    assert (v["tokens_min"], v["tokens_max"], v["spread"], v["round_bound"]) == (1600, 1950, 350, 512)
    assert v["stopped_by"] == {"budget": 4}
    line = ("budget-bound: yes — every RL run stopped by its token budget; realized tokens 1,600–1,950 "
            "(spread 350 ≤ one round's bound 512); 1 incomplete RL run not counted")
    assert v["verdict"] == line
    text = md.read_text()
    assert f"**{line}**" in text and "\n## Budget per run\n" in text
    assert main([str(root)]) == 0
    assert line in capsys.readouterr().out.splitlines()


def test_per_run_table_in_markdown(bound):
    root, runs = bound
    _, md = build_report(root)
    text = md.read_text()
    assert ("| run | condition | seed | status | optimizer steps | max steps | token kind | tokens | ceiling "
            "| % of ceiling | stopped by |") in text
    for line in (
        f"| `{_name(runs['sft0'])}` | sft (warm start) | 0 | completed | 20 | 20 | loss | 500 | 2,000 | 25.0% "
        "| max_steps (40 rows) |",
        f"| `{_name(runs['sft1'])}` | sft (warm start) | 1 | completed | 12 | 20 | loss | 500 | 2,000 | 25.0% "
        "| loss-token cap or end of epoch (24 rows) |",
        f"| `{_name(runs['grpo0'])}` | grpo | 0 | completed | 32 | 100 | sampled | 1,600 | 2,048 | 78.1% | budget |",
        f"| `{_name(runs['grpo1'])}` | grpo | 1 | completed | 39 | 100 | sampled | 1,950 | 2,048 | 95.2% | budget |",
        f"| `{_name(runs['grpo2'])}` | grpo | 2 | running (no completion.json) | – | 100 | sampled | – | 2,048 | – "
        "| – |",
        f"| `{_name(runs['papo0'])}` | papo | 0 | completed | 36 | 100 | sampled | 1,800 | 2,048 | 87.9% | budget |",
    ):
        assert line in text, line
    # the rows follow the condition order
    assert text.index(_name(runs["sft1"]) + "` |") < text.index(_name(runs["grpo0"]) + "` |") \
        < text.index(_name(runs["grpo2"]) + "` |") < text.index(_name(runs["papo0"]) + "` |")


def test_verdict_no_when_runs_stop_at_max_steps(tmp_path, capsys):
    root = tmp_path / "o"
    for arm in ("grpo", "papo"):
        for s in range(2):
            by_budget = arm == "papo" and s == 1
            make_run(root, arm, s, 0.5, steps=8 if by_budget else 10, max_steps=10,
                     stopped_by="budget" if by_budget else "max_steps")
    rep, md = build_report(root)
    v = rep["groups"][0]["budget_bound"]
    line = ("budget-bound: NO — 3 of 4 RL runs stopped at max_steps (same steps, not same budget); "
            "realized tokens 400–500 (spread 100 ≤ one round's bound 128)")
    assert v["budget_bound"] is False and v["stopped_by"] == {"max_steps": 3, "budget": 1}
    assert (v["spread"], v["round_bound"]) == (100, 128) and v["verdict"] == line
    assert f"**{line}**" in md.read_text()
    assert main([str(root)]) == 0
    assert line in capsys.readouterr().out


def test_verdict_no_when_every_run_stops_at_max_steps(basic):  # noqa: F811
    rep, _ = build_report(basic)
    v = rep["groups"][0]["budget_bound"]
    assert v["budget_bound"] is False and v["rl_runs"] == 6 and v["stopped_by"] == {"max_steps": 6}
    assert v["verdict"] == ("budget-bound: NO — every RL run (6) stopped at max_steps (same steps, not same budget); "
                            "realized tokens 500 (spread 0 ≤ one round's bound 128); 1 incomplete RL run not counted")


def test_verdict_no_when_tokens_lie_more_than_a_round_apart(tmp_path):
    root = tmp_path / "o"
    make_run(root, "grpo", 0, 0.5, steps=32, **BUDGET)  # 1,600 tokens, one round's bound 128
    make_run(root, "grpo", 1, 0.5, steps=39, **BUDGET)  # 1,950
    v = build_report(root)[0]["groups"][0]["budget_bound"]
    assert v["budget_bound"] is False and (v["spread"], v["round_bound"]) == (350, 128)
    assert v["verdict"] == ("budget-bound: NO — every RL run stopped by its token budget, but their realized tokens "
                            "lie more than one generation round apart; realized tokens 1,600–1,950 (spread 350 > one "
                            "round's bound 128)")


def test_budget_sweep_compares_within_each_ceiling(tmp_path):
    root = tmp_path / "o"
    for s, steps in enumerate((18, 19)):  # 900, 950 of 1,000 tokens; one round's bound 128
        make_run(root, "grpo", s, 0.5, steps=steps, stopped_by="budget", max_steps=100, ceiling=1000)
    for s, steps in enumerate((32, 39)):  # 1,600, 1,950 of 2,048 tokens; one round's bound 512
        make_run(root, "grpo", s, 0.5, steps=steps, steps_per_generation=4, **BUDGET)
    rep, _ = build_report(root)
    v = rep["groups"][0]["budget_bound"]
    assert v["budget_bound"] is True and v["ceilings"] == [1000, 2048]
    assert [(b["ceiling"], b["spread"], b["round_bound"], b["within_round"]) for b in v["by_ceiling"]] == [
        (1000, 50, 128, True), (2048, 350, 512, True)]
    assert (v["spread"], v["round_bound"]) == (350, 512)  # the largest of each
    assert v["verdict"] == ("budget-bound: yes — every RL run stopped by its token budget; ceiling 1,000: realized "
                            "tokens 900–950 (spread 50 ≤ one round's bound 128); ceiling 2,048: realized tokens "
                            "1,600–1,950 (spread 350 ≤ one round's bound 512)")


def test_verdict_unknown_without_the_plans_round_bound(tmp_path):
    root = tmp_path / "o"
    make_run(root, "grpo", 0, 0.5, steps=32, plan_budget=False, **BUDGET)
    make_run(root, "grpo", 1, 0.5, steps=39, plan_budget=False, **BUDGET)
    rep, md = build_report(root)
    v = rep["groups"][0]["budget_bound"]
    assert v["budget_bound"] is None and v["round_bound"] is None and v["spread"] == 350
    assert v["verdict"] == ("budget-bound: unknown — every RL run stopped by its token budget, but the token spread "
                            "cannot be checked; realized tokens 1,600–1,950 (spread 350; one round's bound not "
                            "recorded in the plan)")
    assert all(r["round_bound"] is None for r in rep["groups"][0]["budget_runs"])


def test_one_rl_run_at_max_steps(tmp_path):
    make_run(tmp_path, "grpo", 0, 0.5)
    v = build_report(tmp_path)[0]["groups"][0]["budget_bound"]
    assert v["budget_bound"] is False
    assert v["verdict"] == ("budget-bound: NO — the one RL run stopped at max_steps (steps, not the budget, ended it); "
                            "realized tokens 500 (spread 0 ≤ one round's bound 128)")


def test_second_run_of_a_seed_is_a_row_not_counted(tmp_path):
    make_run(tmp_path, "grpo", 0, 0.5, steps=32, subdir="a/runs", **BUDGET)
    make_run(tmp_path, "grpo", 0, 0.5, steps=32, subdir="b/runs", **BUDGET)  # the same run copied elsewhere
    rep, md = build_report(tmp_path)
    rows = rep["groups"][0]["budget_runs"]
    assert [r["duplicate"] for r in rows] == [False, True]
    assert rep["groups"][0]["budget_bound"]["rl_runs"] == 1
    assert "completed (second run of this seed: not averaged)" in md.read_text()


def test_sft_only_group_has_no_rl_verdict(tmp_path, capsys):
    root = tmp_path / "o"
    make_run(root, "sft", 0, 0.4, steps=20)
    rep, md = build_report(root)
    v = rep["groups"][0]["budget_bound"]
    assert v["budget_bound"] is None and v["rl_runs"] == 0 and "no complete RL runs" in v["verdict"]
    assert "| loss | 500 | 2,000 | 25.0% | max_steps (40 rows) |" in md.read_text()
    assert main([str(root)]) == 0
    assert "budget-bound" not in capsys.readouterr().out


def test_sft_limit_recorded_by_the_arm_is_shown(tmp_path):
    """completion.json of an SFT run says what cut its epoch prefix (stopped_by_source=sft_prefix): the report shows
    it instead of guessing from the step count."""
    import json

    root = tmp_path / "o"
    run = make_run(root, "sft", 0, 0.4, steps=12, max_steps=20, stopped_by="budget")
    comp_path = run / "completion.json"
    comp = json.loads(comp_path.read_text())
    comp_path.write_text(json.dumps({**comp, "stopped_by_source": "sft_prefix"}))
    rep, md = build_report(root)
    (row,) = rep["groups"][0]["budget_runs"]
    assert row["stopped_by"] == "loss-token cap" and row["stopped_by_recorded"] == "budget"
