"""The grpo arm's knobs (conf/arm/grpo.yaml extends /schema/arm/grpo), the base of every RL arm's
config (papo and evi_po extend GrpoArm), and the plan-time rules of an RL arm. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from harness.config.fields import ArmConfig, f
from harness.rounds import round_of


class LossType(str, Enum):  # TRL 1.16 GRPOConfig.loss_type
    grpo = "grpo"
    dr_grpo = "dr_grpo"
    dapo = "dapo"
    bnpo = "bnpo"
    cispo = "cispo"
    sapo = "sapo"
    luspo = "luspo"
    vespo = "vespo"


class ScaleRewards(str, Enum):  # TRL 1.16 GRPOConfig.scale_rewards
    group = "group"
    batch = "batch"
    none = "none"


class ISLevel(str, Enum):  # TRL importance_sampling_level; "sequence" is GSPO
    token = "token"
    sequence = "sequence"


@dataclass
class GrpoArm(ArmConfig):
    init: str = f("sft", "policy to start from: sft (the SFT run of the same model, data, seed), scratch, or a path")
    prompts_per_step: int = f(4, "unique prompts per optimizer step (all ranks), each with num_generations completions, whatever the accumulation", ge=1)
    num_generations: int = f(8, "G: completions sampled per prompt; advantages are normalized within a group", ge=2)
    max_completion_length: int = f(16, "sampled tokens per completion at most; truncated ones get the invalid-format penalty", ge=1)
    temperature: float = f(0.7, "sampling temperature; 0.7 learns on the tiny VLM where 1.0 did not move greedy accuracy (measured)", gt=0.0)
    top_p: float = f(1.0, "nucleus sampling mass", gt=0.0, le=1.0)
    top_k: int = f(0, "top-k sampling (0 = off)", ge=0)
    loss_type: LossType = f(LossType.dapo, "TRL loss normalization (grpo, dr_grpo, dapo, bnpo, ...)")
    scale_rewards: ScaleRewards = f(ScaleRewards.group, "advantage std scaling: group | batch | none (Dr. GRPO)")
    importance_sampling_level: ISLevel = f(ISLevel.token, "token (GRPO) or sequence (GSPO)")
    beta: float = f(0.0, "KL coefficient to the reference policy (with LoRA: the frozen initial adapter)", ge=0.0)
    epsilon: float = f(0.2, "lower clip range of the importance ratio", gt=0.0)
    epsilon_high: Optional[float] = f(None, "upper clip range (DAPO clip-higher); null = epsilon", gt=0.0)
    num_iterations: int = f(1, "optimization passes over each generation batch (mu in the GRPO paper); from the second pass the importance ratio is not 1", ge=1)
    steps_per_generation: int = f(1, "optimizer steps served by one generation batch (prompts_per_step x this many prompts); TRL shuffles the batch's completions and each step trains on prompts_per_step x num_generations of them, mixed across the batch's prompts (not whole groups; advantages stay full-group)", ge=1)
    mask_truncated_completions: bool = f(True, "exclude truncated completions from the loss (they still count in the budget)")

    def reward_free_terms(self) -> list[str] | None:
        return ["the KL to the reference (arm.beta)"] if self.beta > 0 else []

    def check(self, cfg, out) -> None:
        check_init(self, out)
        check_round(self, cfg, out)
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            out.error("arm.epsilon_high", self.epsilon_high, f"is below arm.epsilon ({self.epsilon})",
                      "set epsilon_high >= epsilon, or null to use epsilon")


def check_init(arm, out) -> None:
    """arm.init of an arm that starts from a policy (every RL arm, opd)."""
    from harness.accounting.weights import is_policy_dir

    if arm.init not in ("sft", "scratch") and not is_policy_dir(arm.init):
        out.error("arm.init", arm.init, "is neither sft, scratch, nor a policy directory (config.json or "
                  "adapter_config.json in it)",
                  "use arm.init=sft (default), arm.init=scratch, or a path to an adapter / full weights")


def check_round(arm, cfg, out) -> None:
    """The generation round of an arm that samples (harness.rounds): its layout, the budget, the save cycle."""
    b = cfg.budget
    rnd = round_of(cfg)
    for problem in rnd.problems():
        out.error(*problem)
    if b.max_completion_tokens < rnd.token_bound:
        out.error("budget.max_completion_tokens", b.max_completion_tokens,
                  f"is below one generation round's worst case ({rnd.prompts} prompts x {arm.num_generations} "
                  f"generations x {arm.max_completion_length} tokens = {rnd.token_bound}), so no round fits",
                  f"raise it to at least {rnd.token_bound}, or shrink the round")
    cycle = rnd.cycle  # TRL regenerates once every `cycle` optimizer steps
    if cycle > 1 and cfg.train.save_steps % cycle:
        out.error("train.save_steps", cfg.train.save_steps,
                  f"must be a multiple of the generation cycle, arm.steps_per_generation x arm.num_iterations "
                  f"({cycle}): the generation buffer is not checkpointed, so a resume mid-cycle would regenerate "
                  "it and diverge",
                  f"use a multiple of {cycle}")


def require_images(cfg, out) -> None:
    """For arms that perturb the image: the model must see one."""
    if not cfg.model.is_vlm:
        out.error("arm", cfg.arm.name, f"{cfg.arm.name} perturbs the image, but model {cfg.model.name} is text-only",
                  "use a VLM (model=tiny_vlm or model=qwen), or arm=grpo")
