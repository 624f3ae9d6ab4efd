"""A resumed run continues its budget from the tokens it had spent at its checkpoint: each rank's tokens_used and
completions, restored by the recipe's open_context from the checkpoint that resume.find picks, are the sums of
that rank's ledger rows up to the checkpoint's step (rows sampled after it, by a process killed later, do not count),
and the resumed run then stops where the run that was never killed stops, with the same ledgers. One rank and two
(tests/unit/trainer_sim.py drives the callbacks; nothing is trained)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import rundir
from harness.accounting.logs import ledger_path, read_rows
from harness.run.stages.resume import find
from harness.run.recipe import open_context
from tests.unit.trainer_sim import Ranks, train

CEILING = 2000
PLACEMENT = {1: [], 2: ["placement=ddp", "placement.num_processes=2"]}


def tokens(rank: int, step: int, j: int) -> int:
    """About 5.5 tokens a completion, different on each rank and step: the budget stops the run near step 9."""
    return (rank + 2 * step + j) % 12


def rows_of(run_dir, rank: int) -> list[dict]:
    return list(read_rows(run_dir / ledger_path(rank)))


def killed_run(plan_of, monkeypatch, world: int):
    """A run checkpointed at steps 2 and 4 and killed (SIGKILL) at the end of step 5: its ledgers hold step 5's rows,
    which no checkpoint bound."""
    plan = plan_of("arm=grpo", *PLACEMENT[world], f"budget.max_completion_tokens={CEILING}")
    rundir.claim(plan).release()
    ranks = Ranks(world, monkeypatch)
    runs = train(plan, plan.run_dir, ranks, tokens, save_steps=2, killed_after=5)
    assert [r.steps for r in runs] == [5] * world and not any(r.ctx.stopped_by_budget for r in runs)
    return plan, ranks


@pytest.mark.parametrize("world", [1, 2])
def test_resumed_totals_are_each_ranks_ledger_up_to_the_checkpoint(plan_of, monkeypatch, world):
    plan, ranks = killed_run(plan_of, monkeypatch, world)
    run_dir = Path(plan.run_dir)
    resume = find(plan, run_dir)
    assert resume.checkpoint.name == "checkpoint-4"
    expected = {}
    for r in range(world):
        rows = rows_of(run_dir, r)
        assert {row["step"] for row in rows} == {0, 1, 2, 3, 4}  # step index 4: the 5th step, after checkpoint-4
        bound = [row for row in rows if row["step"] < 4]
        expected[r] = (sum(row["tokens"] for row in bound), len(bound))
        assert expected[r][0] < sum(row["tokens"] for row in rows)
    for r in range(world):
        with ranks.as_rank(r):
            ctx = open_context(plan, run_dir, resume)
        for lg in (ctx.ledger, ctx.trace, ctx.metrics):
            if lg is not None:
                lg.close()
        assert (ctx.tokens_used, ctx.completions) == expected[r], \
            f"rank {r} resumed with (tokens, completions) {(ctx.tokens_used, ctx.completions)}, its ledger up to " \
            f"checkpoint-4 holds {expected[r]}"
        # the ledger was rolled back to the same point: the budget and the ledger agree from here on
        assert sum(row["tokens"] for row in rows_of(run_dir, r)) == ctx.tokens_used
        assert ctx.token_share == CEILING // world


@pytest.mark.parametrize("world", [1, 2])
def test_a_resumed_run_stops_where_the_run_never_killed_stops(plan_of, monkeypatch, tmp_path, world):
    plan, ranks = killed_run(plan_of, monkeypatch, world)
    resumed = train(plan, plan.run_dir, ranks, tokens, resume=find(plan, Path(plan.run_dir)), save_steps=2)
    straight_plan = plan_of(f"output_root={tmp_path / 'straight'}", "arm=grpo", *PLACEMENT[world],
                            f"budget.max_completion_tokens={CEILING}")
    straight = train(straight_plan, straight_plan.run_dir, ranks, tokens, save_steps=2)
    assert straight[0].steps > 5 and all(r.ctx.stopped_by_budget for r in straight)
    assert [r.steps for r in resumed] == [r.steps for r in straight], \
        f"the resumed run stopped after step {resumed[0].steps}, the run never killed after {straight[0].steps}"
    assert [r.ctx.tokens_used for r in resumed] == [r.ctx.tokens_used for r in straight]
    assert [r.ctx.completions for r in resumed] == [r.ctx.completions for r in straight]
    for r in range(world):
        a, b = rows_of(Path(plan.run_dir), r), rows_of(Path(straight_plan.run_dir), r)
        assert [(x["completion_id"], x["tokens"]) for x in a] == [(x["completion_id"], x["tokens"]) for x in b]
        assert sum(x["tokens"] for x in a) == resumed[r].ctx.tokens_used <= CEILING // world
