"""The reward function handed to TRL: scores every sampled completion and accounts for it.

For each completion it appends one ledger row (completion_id, sampled tokens without padding,
terminated or truncated, step) and one reward-trace row (reward, components, parsed answer,
parser error, relation, provenance) to this rank's logs, then returns the rewards. TRL calls
it as f(prompts=, completions=, completion_ids=, **dataset columns repeated per completion,
trainer_state=, log_extra=, log_metric=) — see docs/platform.md.

completion_id = <semantic hash[:8]>:<generation step>:<prompt slot>:<generation index>; the
generation step is the first optimizer step of the generation round (harness.rounds: TRL generates
once per round, whatever the gradient accumulation), the prompt slot the prompt's position among the
round's prompts over all ranks, so ids are unique across ranks, rounds and steps. A second call within
one round means the TRL mapping no longer matches harness.rounds: it is refused, not renumbered.
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.rewards import completion_text, cut_at_eos, score


class HarnessReward:
    def __init__(self, ctx, *, reward_cfg: Any, eos_token_ids: list[int], provenance: dict):
        self.ctx = ctx
        self.reward_cfg = reward_cfg
        self.eos = set(eos_token_ids)
        self.provenance = provenance
        self.tag = provenance["semantic_sha256"][:8]
        self.__name__ = "harness"  # TRL names reward columns after it (rewards/harness/mean)
        self._last_step = None  # the generation step of the previous call

    def __call__(self, prompts, completions, completion_ids, trainer_state=None, row=None, **_):
        ctx = self.ctx
        step = trainer_state.global_step if trainer_state is not None else -1
        n, rnd = len(completions), ctx.round
        if step == self._last_step or n != rnd.local_completions or not rnd.opens_round(max(step, 0)):
            raise RuntimeError(f"TRL asked for rewards of {n} completions at step {step} (previous call: step "
                               f"{self._last_step}); the generation round (harness.rounds) samples "
                               f"{rnd.local_completions} per rank once every {rnd.cycle} optimizer step(s): the TRL "
                               "mapping no longer matches TRL; run tests/unit/test_trl_contract.py")
        self._last_step = step
        rewards = []
        for j in range(n):
            ids = completion_ids[j]
            record = json.loads(row[j])
            _, truncated = cut_at_eos(ids, self.eos)  # TRL cut the ids after their first end-of-sequence
            slot, gen = rnd.slot(ctx.rank, j)
            cid = f"{self.tag}:{step}:{slot}:{gen}"
            tr = score(completion_text(completions[j]), record, truncated=truncated, cfg=self.reward_cfg)
            if not math.isfinite(tr.total):  # a NaN reward would poison the group's advantages without a trace
                raise ValueError(f"the reward of completion {cid} is {tr.total} (components {tr.components}): "
                                 "rewards must be finite; check reward.*")
            ctx.ledger.append({"completion_id": cid, "tokens": len(ids), "terminated": not truncated, "step": step,
                               "view": record["key"]})
            ctx.trace.append({
                "completion_id": cid, "reward": tr.total, "components": tr.components, "parsed": tr.parsed,
                "prediction": tr.prediction, "gold": tr.gold, "parser_error": tr.parser_error,
                "relation": tr.relation, "truncated": truncated, "correct": tr.correct, "view": record["key"],
                "step": step, "provenance": self.provenance,
            })
            ctx.tokens_used += len(ids)
            ctx.completions += 1
            rewards.append(tr.total)
        ctx.ledger.flush()
        ctx.trace.flush()
        return rewards


def provenance_of(plan) -> dict:
    """What every trace row carries of the run that sampled it."""
    code = plan.identity.get("code") or {}
    return {"config_sha256": plan.identity["config_sha256"], "semantic_sha256": plan.identity["semantic_sha256"],
            "commit": code.get("commit"), "dirty": code.get("dirty")}
