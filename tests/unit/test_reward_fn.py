"""HarnessReward's completion ids: unique across ranks, generation rounds and steps (the ledger's key), numbered by
the one definition of a generation round (harness.rounds)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from harness.accounting.logs import AppendLog, read_rows
from harness.accounting.ledger import HarnessReward
from harness.rewards.functions import Rewards
from harness.rounds import GenerationRound


class _Cfg:
    correct, format_weight, invalid_penalty = 1.0, 0.0, -0.5


def _reward(tmp_path, rank: int, world: int, *, prompts_per_step=4, G=8, spg=1, iters=1, accum=1):
    rnd = GenerationRound(prompts_per_step=prompts_per_step, num_generations=G, steps_per_generation=spg,
                          num_iterations=iters, gradient_accumulation_steps=accum, max_completion_length=16,
                          world=world)
    ctx = SimpleNamespace(rank=rank, world=world, tokens_used=0, completions=0, round=rnd,
                          ledger=AppendLog(tmp_path, f"ledgers/rank-{rank}.jsonl"),
                          trace=AppendLog(tmp_path, f"traces/rank-{rank}.jsonl"))
    fn = HarnessReward(ctx, rewards=Rewards.builtin(_Cfg()), eos_token_ids=[0],
                       provenance={"semantic_sha256": "abcdef0123", "config_sha256": "x"})
    return fn, ctx


def _call(fn, step: int, n: int):
    row = json.dumps({"key": "s0:full", "relation": "FULL", "target": "red", "answer_type": "word"})
    fn(prompts=["p"] * n, completions=["<answer>red</answer>"] * n, completion_ids=[[5, 0]] * n,
       trainer_state=SimpleNamespace(global_step=step), row=[row] * n)


def _close(*ctxs):
    for ctx in ctxs:
        ctx.ledger.close()
        ctx.trace.close()


def test_ids_unique_on_two_ranks_with_accumulation(tmp_path):
    """2 ranks, 4 prompts x 8 per step, accumulation 4: one round per step of 16 completions per rank (TRL
    generates once for the whole step); rank 1 holds prompts 2 and 3."""
    fns = [_reward(tmp_path, r, 2, accum=4) for r in (0, 1)]
    for step in (0, 1):
        for fn, _ in fns:
            _call(fn, step, 16)
    _close(*(ctx for _, ctx in fns))
    ids = [r["completion_id"] for rank in (0, 1) for r in read_rows(tmp_path / f"ledgers/rank-{rank}.jsonl")]
    assert len(ids) == len(set(ids)) == 2 * 2 * 16
    rank1 = [r["completion_id"] for r in read_rows(tmp_path / "ledgers/rank-1.jsonl")]
    assert rank1[:2] == ["abcdef01:0:2:0", "abcdef01:0:2:1"] and rank1[15] == "abcdef01:0:3:7"


def test_steps_per_generation_numbers_the_rounds_prompts(tmp_path):
    """steps_per_generation=2: one round of 8 prompts at step 0 serves steps 0 and 1; the next opens at step 2."""
    fn, ctx = _reward(tmp_path, 0, 1, spg=2)
    _call(fn, 0, 64)
    _call(fn, 2, 64)
    _close(ctx)
    ids = [r["completion_id"] for r in read_rows(tmp_path / "ledgers/rank-0.jsonl")]
    assert ids[0] == "abcdef01:0:0:0" and ids[63] == "abcdef01:0:7:7" and ids[64] == "abcdef01:2:0:0"
    assert len(set(ids)) == 128


def test_a_second_generation_within_a_round_is_refused(tmp_path):
    """Before harness.rounds, TRL generated once per micro-batch and a counter renumbered the extra rounds; now a
    call that does not open a round means the TRL mapping broke, and the ledger must not absorb it."""
    fn, ctx = _reward(tmp_path, 0, 1, spg=2)
    _call(fn, 0, 64)
    with pytest.raises(RuntimeError, match="generation round"):
        _call(fn, 0, 64)  # the same step again
    with pytest.raises(RuntimeError, match="generation round"):
        _call(fn, 1, 64)  # step 1 trains on round 0; it samples nothing
    with pytest.raises(RuntimeError, match="generation round"):
        _call(fn, 2, 32)  # a round of the wrong size
    _close(ctx)
