"""HarnessReward's completion ids: unique across ranks, generation rounds and steps (the ledger's key)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from harness.accounting import AppendLog, read_rows
from harness.reward_fn import HarnessReward


class _Cfg:
    correct, format_weight, invalid_penalty = 1.0, 0.0, -0.5


def _reward(tmp_path, rank: int, world: int, G: int = 8):
    ctx = SimpleNamespace(rank=rank, world=world, tokens_used=0, completions=0,
                          ledger=AppendLog(tmp_path, f"ledgers/rank-{rank}.jsonl"),
                          trace=AppendLog(tmp_path, f"traces/rank-{rank}.jsonl"))
    fn = HarnessReward(ctx, reward_cfg=_Cfg(), num_generations=G, eos_token_ids=[0],
                       provenance={"semantic_sha256": "abcdef0123", "config_sha256": "x"})
    return fn, ctx


def _call(fn, step: int, n: int):
    row = json.dumps({"key": "s0:full", "relation": "FULL", "target": "red", "answer_type": "word"})
    fn(prompts=["p"] * n, completions=["<answer>red</answer>"] * n, completion_ids=[[5, 0]] * n,
       trainer_state=SimpleNamespace(global_step=step), row=[row] * n)


def test_ids_unique_with_gradient_accumulation_on_two_ranks(tmp_path):
    """2 ranks x 4 generation rounds per optimizer step (TRL generates per micro-batch), 4 completions per rank
    and round, G=8: each round is one prompt whose 8 generations are split over the ranks. Before the round
    counter, every round of a step reused slot 0 (64 duplicate ids in a real 8-step run)."""
    fns = [_reward(tmp_path, r, 2) for r in (0, 1)]
    for step in (0, 1):
        for _ in range(4):
            for fn, _ctx in fns:
                _call(fn, step, 4)
    for _, ctx in fns:
        ctx.ledger.close()
        ctx.trace.close()
    ids = [r["completion_id"] for rank in (0, 1) for r in read_rows(tmp_path / f"ledgers/rank-{rank}.jsonl")]
    assert len(ids) == len(set(ids)) == 2 * 2 * 4 * 4
    # step 0, round 1 is the step's second prompt: slot 1; rank 1 holds its generations 4..7
    rank1 = [r["completion_id"] for r in read_rows(tmp_path / "ledgers/rank-1.jsonl")]
    assert rank1[4:8] == ["abcdef01:0:1:4", "abcdef01:0:1:5", "abcdef01:0:1:6", "abcdef01:0:1:7"]


def test_single_process_ids_unchanged(tmp_path):
    """One round per step (no accumulation): the ids of earlier runs (slot = prompt index) stay the same."""
    fn, ctx = _reward(tmp_path, 0, 1)
    _call(fn, 3, 16)
    ctx.ledger.close()
    ids = [r["completion_id"] for r in read_rows(tmp_path / "ledgers/rank-0.jsonl")]
    assert ids[0] == "abcdef01:3:0:0" and ids[15] == "abcdef01:3:1:7"
