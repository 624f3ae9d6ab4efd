"""The budget stop on two ranks whose sampled tokens differ: each rank's share is half the ceiling, the rank whose
next round could exceed its share triggers the stop, the decision is all-reduced so both ranks stop after the same
step, and the ranks' tokens together never exceed the ceiling. The ranks are threads whose collectives meet
(tests/unit/trainer_sim.py); the share comes from the recipe's open_context, the stop from BudgetCallback."""

from __future__ import annotations

import json
import random

import pytest

from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
from harness.accounting.logs import ledger_path, read_rows
from harness.run.stages.resume import ResumePoint
from harness.run.recipe import open_context
from tests.unit.trainer_sim import Ranks, train

CEILING = 2000  # budget.max_completion_tokens: a share of 1000 per rank
MAX_LEN = 16  # the default arm's max_completion_length
ROUND = 4 * 8 * MAX_LEN // 2  # one generation round's worst case on one rank: 16 completions x 16 tokens = 256


@pytest.fixture
def plan(plan_of):
    return plan_of("arm=grpo", "placement=ddp", "placement.num_processes=2", f"budget.max_completion_tokens={CEILING}")


def per_rank(lengths: dict[int, int]):
    """Every completion of rank r has lengths[r] tokens."""
    return lambda rank, step, j: lengths[rank]


def test_each_rank_gets_its_share_of_the_ceiling(plan, tmp_path, monkeypatch):
    ranks = Ranks(2, monkeypatch)
    for r in (0, 1):
        with ranks.as_rank(r):
            ctx = open_context(plan, tmp_path, ResumePoint())
        assert (ctx.rank, ctx.world, ctx.token_share) == (r, 2, CEILING // 2), f"rank {r}'s share is {ctx.token_share}"
        assert ctx.round.token_bound // ctx.world == ROUND and ctx.round.local_completions == 16


@pytest.mark.parametrize("heavy", [0, 1])
def test_the_rank_that_could_exceed_its_share_stops_both_ranks_after_the_same_step(plan, tmp_path, monkeypatch, heavy):
    """The heavy rank samples every completion to max length (256 a step), the light one 4 tokens (64 a step).
    After step 3 the heavy rank has 768 and the next round could take it to 1024 > 1000: both stop there, although
    the light rank alone would go on to step 12."""
    light = 1 - heavy
    runs = train(plan, tmp_path, Ranks(2, monkeypatch), per_rank({heavy: MAX_LEN, light: 4}))
    assert [r.steps for r in runs] == [3, 3], \
        f"the ranks stopped after steps {[r.steps for r in runs]}, not after step 3 (the heavy rank's last that fits)"
    assert all(r.ctx.stopped_by_budget for r in runs)
    used = {r.ctx.rank: r.ctx.tokens_used for r in runs}
    assert used == {heavy: 3 * ROUND, light: 3 * 64}
    assert used[heavy] + ROUND > CEILING // 2 >= used[heavy] and sum(used.values()) <= CEILING
    # the final checkpoint is the stop's: both ranks' counters, and the stop recorded
    m = json.loads((tmp_path / "checkpoints/checkpoint-3" / CHECKPOINT_MANIFEST).read_text())
    assert m["permanent"] and m["totals"]["stopped_by_budget"]
    assert m["rank_totals"][f"rank-{heavy}"]["completion_tokens"] == 3 * ROUND
    assert m["rank_totals"][f"rank-{light}"]["completion_tokens"] == 3 * 64
    assert m["totals"]["completion_tokens"] == sum(used.values())


def test_a_light_rank_does_not_stop_a_heavy_one_early(plan, tmp_path, monkeypatch):
    """Rank 0 samples 200 tokens a step, rank 1 nothing: the stop follows rank 0's share (1000), not the ceiling
    divided by the tokens of both ranks: 200k + 256 > 1000 first at k = 4."""
    runs = train(plan, tmp_path, Ranks(2, monkeypatch), lambda rank, step, j: (13 if j < 8 else 12) if rank == 0 else 0)
    assert [r.steps for r in runs] == [4, 4], f"the ranks stopped after steps {[r.steps for r in runs]}, not 4"
    assert [r.ctx.tokens_used for r in runs] == [4 * 200, 0]


@pytest.mark.parametrize("seed", range(12))
def test_uneven_random_ranks_stop_together_at_the_last_step_that_fits_every_share(plan, tmp_path, monkeypatch, seed):
    """Random lengths, a different mean on each rank: after every step but the last, each rank's tokens plus one
    more worst-case round fit its share; after the last, some rank's do not; and no rank ever exceeds its share."""
    rng = random.Random(seed)
    bias = {0: rng.randint(2, MAX_LEN), 1: rng.randint(2, MAX_LEN)}  # (>= 2: at most ~40 steps)
    lengths = {(r, s, j): min(MAX_LEN, max(0, bias[r] + rng.randint(-4, 4)))
               for r in (0, 1) for s in range(200) for j in range(16)}
    runs = train(plan, tmp_path, Ranks(2, monkeypatch), lambda rank, step, j: lengths[rank, step, j])
    last = runs[0].steps
    assert [r.steps for r in runs] == [last, last] and all(r.ctx.stopped_by_budget for r in runs)
    share = CEILING // 2
    for r in (0, 1):
        rows = list(read_rows(tmp_path / ledger_path(r)))
        assert {row["step"] for row in rows} == set(range(last)), "a rank sampled after the stop, or missed a step"
        after = [sum(row["tokens"] for row in rows if row["step"] < k) for k in range(1, last + 1)]
        assert after[-1] == runs[r].ctx.tokens_used <= share, f"rank {r} sampled {after[-1]} tokens, its share {share}"
        assert all(t + ROUND <= share for t in after[:-1]), f"rank {r} was stopped while the next round fit its share"
    assert any(runs[r].ctx.tokens_used + ROUND > share for r in (0, 1)), "both ranks could have taken one more round"
    assert sum(r.ctx.tokens_used for r in runs) <= CEILING
