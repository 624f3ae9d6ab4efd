"""The generation round of the RL arms: the one definition of batch semantics, in harness units and in TRL's.

A generation round samples one batch of completions and trains on it:

    prompts            = arm.prompts_per_step x arm.steps_per_generation        (all ranks)
    completions        = prompts x arm.num_generations                            (all ranks)
    optimizer steps    = arm.steps_per_generation x arm.num_iterations            (the round's length, its "cycle")

Each optimizer step of a pass trains on `arm.prompts_per_step` of the round's prompts (all their
completions); `arm.num_iterations` passes go over the whole batch, so from the second pass on the
policy differs from the sampling policy and TRL's importance ratio is not 1 (old log-probs are
recorded at generation time). `arm.gradient_accumulation_steps` only splits an optimizer step's
completions into micro-batches: it changes neither what is sampled nor the update.

TRL counts `steps_per_generation` in micro-batches (its `_step` advances once per micro-batch and it
regenerates every `steps_per_generation x num_iterations` of them), so the harness passes
`steps_per_generation x gradient_accumulation_steps`, and a per-device batch of one micro-batch.

Every reader of these semantics goes through `GenerationRound`: the TRL mapping (arms.grpo), the
plan checks (harness.config.checks), the budget callback and completion ids (harness.run.callbacks,
harness.accounting.ledger), papo's mask seeds and evi_po's view owners (arms/). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


FIXED_AT_ONE = ("num_generations", "steps_per_generation", "num_iterations")


@dataclass(frozen=True)
class GenerationRound:
    prompts_per_step: int  # unique prompts per optimizer step, all ranks
    num_generations: int  # G: completions per prompt
    steps_per_generation: int  # optimizer steps (per pass) served by one generation batch
    num_iterations: int  # passes over each generation batch
    gradient_accumulation_steps: int  # micro-batches per optimizer step
    max_completion_length: int  # sampled tokens per completion at most
    world: int = 1  # ranks

    @classmethod
    def of(cls, arm: Any, world: int = 1) -> "GenerationRound":
        """From the arm config (a dict of the plan's config, or the typed GrpoArm). An arm whose trainer fixes
        num_generations, steps_per_generation and num_iterations at 1 (opd) has no such fields: they are 1."""
        if isinstance(arm, dict):
            get = lambda k: arm[k] if k in arm or k not in FIXED_AT_ONE else 1  # noqa: E731
        else:
            get = lambda k: getattr(arm, k)  # noqa: E731
        return cls(prompts_per_step=get("prompts_per_step"), num_generations=get("num_generations"),
                   steps_per_generation=get("steps_per_generation"), num_iterations=get("num_iterations"),
                   gradient_accumulation_steps=get("gradient_accumulation_steps"),
                   max_completion_length=get("max_completion_length"), world=world)

    # --- harness units

    @property
    def completions_per_step(self) -> int:
        """Completions one optimizer step trains on (all ranks)."""
        return self.prompts_per_step * self.num_generations

    @property
    def prompts(self) -> int:
        """Prompts sampled per round (all ranks)."""
        return self.prompts_per_step * self.steps_per_generation

    @property
    def completions(self) -> int:
        """Completions sampled per round (all ranks)."""
        return self.prompts * self.num_generations

    @property
    def local_completions(self) -> int:
        """Completions one rank samples per round."""
        return self.completions // self.world

    @property
    def cycle(self) -> int:
        """Optimizer steps between two generations."""
        return self.steps_per_generation * self.num_iterations

    @property
    def token_bound(self) -> int:
        """Worst-case sampled tokens of one round (all ranks): every completion runs to max_completion_length."""
        return self.completions * self.max_completion_length

    @property
    def per_step_token_bound(self) -> int:
        """A round's bound spread over the optimizer steps of one pass (what one step's prompts can cost)."""
        return self.completions_per_step * self.max_completion_length

    def opens_round(self, global_step: int) -> bool:
        """Does the optimizer step with index `global_step` (0-based) start by generating?"""
        return global_step % self.cycle == 0

    def index(self, global_step: int) -> int:
        """The round that the optimizer step with index `global_step` trains on."""
        return global_step // self.cycle

    def slot(self, rank: int, local_index: int) -> tuple[int, int]:
        """(prompt slot within the round, generation index) of a rank's local completion `local_index`.

        TRL's sampler gives each rank a contiguous block of the round's completions, with the G completions
        of one prompt adjacent; the slot numbers the round's prompts over all ranks.
        """
        return divmod(rank * self.local_completions + local_index, self.num_generations)

    # --- TRL units (GRPOConfig)

    @property
    def per_device_train_batch_size(self) -> int:
        """Completions in one micro-batch of one rank."""
        return self.completions_per_step // (self.world * self.gradient_accumulation_steps)

    @property
    def trl_steps_per_generation(self) -> int:
        """TRL's steps_per_generation counts micro-batches, not optimizer steps."""
        return self.steps_per_generation * self.gradient_accumulation_steps

    def trl_kwargs(self) -> dict:
        return {"per_device_train_batch_size": self.per_device_train_batch_size,
                "steps_per_generation": self.trl_steps_per_generation,
                "num_iterations": self.num_iterations,
                "num_generations": self.num_generations}

    # --- rules (harness.config.checks reports them with the field and the fix)

    def problems(self) -> list[tuple[str, int, str, str]]:
        """(field, value, why, fix) for every way this round cannot be laid out over ranks and micro-batches."""
        out = []
        shards = self.world * self.gradient_accumulation_steps
        if self.completions_per_step % shards:
            out.append(("arm.prompts_per_step", self.prompts_per_step,
                        f"prompts_per_step x num_generations ({self.completions_per_step}) must split evenly over "
                        f"the job's {self.world} rank(s) (placement.num_machines x placement.num_processes) x "
                        f"arm.gradient_accumulation_steps ({shards}) micro-batches",
                        f"make {self.completions_per_step} a multiple of {shards}"))
        return out

    def describe(self) -> dict:
        """The plan's record of the round (harness units and what TRL is given)."""
        return {
            "prompts": self.prompts,
            "completions": self.completions,
            "optimizer_steps": self.cycle,
            "passes": self.num_iterations,
            "token_bound": self.token_bound,
            "micro_batches_per_step": self.gradient_accumulation_steps,
            "trl": self.trl_kwargs(),
        }


def round_of(cfg: Any) -> GenerationRound:
    """The generation round of a typed config (harness.config.schema.Config): the one place a plan's round is
    built (Plan.round through its kind, the budget summary, the arms' plan checks)."""
    return GenerationRound.of(cfg.arm, world=cfg.placement.world_size)
