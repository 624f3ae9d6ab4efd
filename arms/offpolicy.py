"""The TRL glue of off-policy rounds (rollout=async, harness.offpolicy): the trainer that takes its rounds from the
buffer, and the sampler's trainer that fills it. Imports torch and trl: loaded by arms.grpo's build and the sampler
process only. Next to arms.trl_hooks, the only other code that touches GRPOTrainer internals; each private point is
tagged NOTE(trl-1.16) and pinned by tests/unit/test_trl_contract.py:

  1. `_generate_single_turn` is replaced on both sides. The sampler generates with TRL's own transformers path
     (the synchronous rollout's code, `use_vllm` off around it); the trainer returns the buffer's round.
  2. `use_vllm` is set after construction, never passed to GRPOConfig (which would start vLLM): TRL applies its
     importance-sampling correction (`vllm_importance_sampling_*`, between `old_per_token_logps` and
     `sampling_per_token_logps`) only when it is set. In the trainer that correction is the decoupled-PPO weight
     between the weights that sampled a round (behaviour) and its own at the round's start (proximal); in the
     sampler it makes TRL compute `old_per_token_logps`, which there are the behaviour log-probs.
"""

from __future__ import annotations

import json
import logging

import torch
from trl import GRPOTrainer

from harness.offpolicy import age_allowed
from harness.offpolicy.buffer import Round, prune_versions, publish_version, read_round, rollback

log = logging.getLogger("harness")


class SamplerGRPOTrainer(GRPOTrainer):
    """The sampler process's trainer: never trains; `sample(inputs)` runs TRL's generation and scoring of one round
    and returns what the buffer keeps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_vllm = True  # NOTE(trl-1.16): private point 2 (old_per_token_logps computed: the behaviour log-probs)
        self._captured = None

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # NOTE(trl-1.16): private point 1. TRL's transformers generate, as the synchronous path runs it.
        self.use_vllm = False
        try:
            completion_ids, _ = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                             has_tool_images)
        finally:
            self.use_vllm = True
        self._captured = ([list(p) for p in prompt_ids], completion_ids)
        return completion_ids, [[0.0] * len(c) for c in completion_ids]  # ignored: the ratio is not used here

    def sample(self, inputs: list[dict]) -> tuple[list, list, list]:
        """(prompt ids, completion ids, per-token behaviour log-probs) of one round's rows."""
        self.model.train()  # TRL's "train" mode: the round's num_generations and batch size
        out = self._generate_and_score_completions(inputs)
        prompt_ids, completion_ids = self._captured
        logps = out["old_per_token_logps"]
        return prompt_ids, completion_ids, [logps[i, :len(c)].tolist() for i, c in enumerate(completion_ids)]


def no_reward(prompts, completions, **_):
    """The sampler scores nothing: the trainer's reward function does, once, for the ledger."""
    return [0.0] * len(completions)


class OffPolicyGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose rounds come from the off-policy buffer (harness.offpolicy), corrected by TRL's
    importance-sampling ratio. `sampler`: the harness.offpolicy.process.SamplerProcess that fills the buffer."""

    def __init__(self, *args, sampler, threads: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.threads = threads  # torch threads while training, on a CPU shared with the sampler
        self.use_vllm = True  # NOTE(trl-1.16): private point 2 (the correction of sampling_per_token_logps)
        self.sampler = sampler
        self.offpolicy_round: Round | None = None
        reward = self.reward_funcs[0]
        self._ledger = reward if hasattr(reward, "hold_trace") else None  # the harness's (tests may give another)
        if self._ledger is not None:
            self._ledger.hold_trace()  # each trace row waits for its importance weight (below)

    @property
    def run_dir(self):
        return self.sampler.run_dir

    def train(self, *args, **kwargs):
        before = torch.get_num_threads()
        if self.threads is not None:  # the sampler takes the other cores' share (harness.offpolicy.process)
            torch.set_num_threads(self.threads)
        try:
            return super().train(*args, **kwargs)
        finally:
            self.sampler.stop()
            torch.set_num_threads(before)  # the next job of a sweep (same process) runs as it would alone

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        # NOTE(trl-1.16): private point 1. Training rounds come from the buffer; anything else (an eval through
        # TRL: use_vllm is off, see _generate_and_score_completions) generates here as TRL does.
        if not self.model.training:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        rnd = self.generation_round.index(self.state.global_step)
        lag, cap = self.sampler.lag, self.sampler.cap
        if self.sampler.proc is None:  # this training's first round: the buffer rolled back to it
            removed = rollback(self.run_dir, rnd, lag)
            if any(removed.values()):
                log.info("off-policy buffer: rolled back to round %d (%s)", rnd, removed)
        publish_version(self.model, self.run_dir, rnd)  # the weights at the start of round rnd
        used = self._ledger.ctx.tokens_used if self._ledger is not None else 0
        self.sampler.wait(rnd, tokens_used=used)  # started (again) where it must be
        got = read_round(self.run_dir, rnd)
        if not age_allowed(rnd, got.version, lag, cap) or got.prompt_ids != [list(p) for p in prompt_ids]:
            raise RuntimeError(f"the off-policy buffer's round {rnd} (sampled by version {got.version}) does not hold "
                               f"this round's prompts, or a version rollout.lag={lag} and rollout.max_policy_age={cap} "
                               "allow: the sampler's schedule no longer matches the trainer's")
        self.offpolicy_round = got
        if self._ledger is not None:
            self._ledger.ctx.sampled_version = got.version  # the ledger rows of this round carry it
        prune_versions(self.run_dir, below=self.sampler.oldest_needed(rnd))
        return got.completion_ids, got.logps

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:  # an eval through TRL: sampled here, on-policy, nothing to correct
            self.use_vllm = False
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self.use_vllm = True
        keys = [json.loads(x["row"])["key"] for x in inputs]
        out = super()._generate_and_score_completions(inputs)
        got = self.offpolicy_round
        if got is None or got.keys != keys:
            raise RuntimeError(f"the off-policy buffer's round does not hold this round's rows (buffer "
                               f"{(got.keys if got else [])[:4]}..., trainer {keys[:4]}...): the sampler's schedule "
                               "no longer matches the trainer's data order")
        if self._ledger is not None:
            self._record_weights(out, got)
        return out

    def _record_weights(self, out: dict, got: Round) -> None:
        """Each completion's importance weights (TRL's, after its truncation or masking) into its trace row."""
        ratio = out["importance_sampling_ratio"]  # (B, 1) at sequence level, (B, T) at token level
        mask = out["completion_mask"].bool()
        age = got.round - got.version
        for i in range(ratio.size(0)):
            w = ratio[i] if ratio.size(1) == 1 else ratio[i][mask[i]]
            w = w.float() if w.numel() else torch.ones(1)
            self._ledger.complete(i, {"policy_version": got.version, "policy_age": age,
                                      "is_weight": {"mean": w.mean().item(), "min": w.min().item(),
                                                    "max": w.max().item()}})
