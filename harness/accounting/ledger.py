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

An arm whose trace rows carry what only its loss knows (opd: the per-completion divergence to the teacher) holds
them (`hold_trace()`): the ledger rows are written at once (the budget counts them), the trace rows wait until
`complete(index, fields)` has filled every one of the call's completions, then go out in sampling order, within
the optimizer step (before any checkpoint binds the trace's frontier).
"""

from __future__ import annotations

import json
import math
from typing import Any

from harness.rewards import cut_at_eos


class HarnessReward:
    def __init__(self, ctx, *, rewards: Any, eos_token_ids: list[int], provenance: dict):
        self.ctx = ctx
        self.rewards = rewards  # harness.rewards.functions.Rewards: the configured reward functions
        self.eos = set(eos_token_ids)
        self.provenance = provenance
        self.tag = provenance["semantic_sha256"][:8]
        self.__name__ = "harness"  # TRL names reward columns after it (rewards/harness/mean)
        self._last_step = None  # the generation step of the previous call
        self._held: list[dict] | None = None  # hold_trace(): this round's trace rows, until complete() fills them
        self._missing: set[int] = set()

    def hold_trace(self) -> None:
        """From now on, each call's trace rows wait for complete() (see the module docstring)."""
        self._held = []

    @property
    def pending(self) -> int:
        """Trace rows of the last call still waiting for complete()."""
        return len(self._missing)

    def complete(self, index: int, fields: dict) -> None:
        """Add `fields` to the trace row of the last call's completion `index` (its position in that call);
        once every row has them, write the rows in order."""
        if self._held is None or index not in self._missing:
            raise RuntimeError(f"complete({index}): no held trace row waits for it (held {len(self._held or [])}, "
                               f"missing {sorted(self._missing)[:8]}): each completion is completed once")
        self._held[index].update(fields)
        self._missing.discard(index)
        self.ctx.trace_pending = len(self._missing)
        if not self._missing:
            for r in self._held:
                self.ctx.trace.append(r)
            self.ctx.trace.flush()

    def __call__(self, prompts, completions, completion_ids, trainer_state=None, row=None, **_):
        ctx = self.ctx
        step = trainer_state.global_step if trainer_state is not None else -1
        n, rnd = len(completions), ctx.round
        if step == self._last_step or n != rnd.local_completions or not rnd.opens_round(max(step, 0)):
            raise RuntimeError(f"TRL asked for rewards of {n} completions at step {step} (previous call: step "
                               f"{self._last_step}); the generation round (harness.rounds) samples "
                               f"{rnd.local_completions} per rank once every {rnd.cycle} optimizer step(s): the TRL "
                               "mapping no longer matches TRL; run tests/unit/test_trl_contract.py")
        if self._missing:
            raise RuntimeError(f"{len(self._missing)} trace rows of step {self._last_step} were never completed "
                               f"before TRL sampled again at step {step}: the loss did not see every completion")
        self._last_step = step
        records = [json.loads(r) for r in row]
        # TRL cut the ids after their first end-of-sequence: no end-of-sequence means truncated
        truncated = [cut_at_eos(ids, self.eos)[1] for ids in completion_ids]
        # every reward function is called before any ledger row is written: a failing call leaves no trace of the step
        traces = self.rewards.score(prompts, completions, completion_ids, records, truncated, trainer_state)
        rewards, rows = [], []
        for j, (ids, record, tr) in enumerate(zip(completion_ids, records, traces)):
            slot, gen = rnd.slot(ctx.rank, j)
            cid = f"{self.tag}:{step}:{slot}:{gen}"
            if not math.isfinite(tr.total):  # a NaN reward would poison the group's advantages without a trace
                raise ValueError(f"the reward of completion {cid} is {tr.total} (components {tr.components}): "
                                 "rewards must be finite; check reward.*")
            entry = {"completion_id": cid, "tokens": len(ids), "terminated": not tr.truncated, "step": step,
                     "view": record["key"]}
            version = getattr(ctx, "sampled_version", None)
            if version is not None:  # rollout=async: the weights that sampled it, and their age
                entry.update(policy_version=version, policy_age=rnd.index(step) - version)
            ctx.ledger.append(entry)
            rows.append({
                "completion_id": cid, "reward": tr.total, "components": tr.components, "parsed": tr.parsed,
                "prediction": tr.prediction, "gold": tr.gold, "parser_error": tr.parser_error,
                "relation": tr.relation, "truncated": tr.truncated, "correct": tr.correct, "view": record["key"],
                "step": step, "provenance": self.provenance,
            })
            ctx.tokens_used += len(ids)
            ctx.completions += 1
            rewards.append(tr.total)
        ctx.round_rows = (step, rows)  # the learning-signal monitor's view of this round (harness.run.learning)
        ctx.ledger.flush()
        if self._held is not None:
            self._held, self._missing = rows, set(range(n))
            ctx.trace_pending = n
        else:
            for r in rows:
                ctx.trace.append(r)
            ctx.trace.flush()
        return rewards


def provenance_of(plan) -> dict:
    """What every trace row carries of the run that sampled it."""
    code = plan.identity.get("code") or {}
    return {"config_sha256": plan.identity["config_sha256"], "semantic_sha256": plan.identity["semantic_sha256"],
            "commit": code.get("commit"), "dirty": code.get("dirty")}
