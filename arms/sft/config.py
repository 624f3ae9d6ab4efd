"""The sft arm's knobs (conf/arm/sft.yaml extends /schema/arm/sft) and its plan-time rules. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness.config.fields import ArmConfig, f


@dataclass
class SftArm(ArmConfig):
    batch_size: int = f(16, "sequences per optimizer step (global, across ranks)", ge=1)
    max_length: int = f(256, "tokens per sequence (prompt + completion); longer rows are refused", ge=8)
    completion_only_loss: bool = f(True, "train only on completion tokens (docs/arms.md sft)")
    epochs: Optional[int] = f(1, "passes over the training split at most, each in a fresh seeded order (the first is the "
                              "order a one-pass run trains on); null = as many as budget.max_steps needs; the loss-token "
                              "cap and budget.max_steps stop it first when they bind", ge=1)

    def check(self, cfg, out) -> None:
        shards = cfg.placement.world_size * self.gradient_accumulation_steps
        if self.batch_size % shards:
            # the Trainer would floor batch_size / shards per device and silently train on fewer sequences
            lo, hi = self.batch_size // shards * shards, -(-self.batch_size // shards) * shards
            out.error("arm.batch_size", self.batch_size,
                      f"must split evenly over the job's {cfg.placement.world_size} rank(s) (placement.num_machines x "
                      f"placement.num_processes) x arm.gradient_accumulation_steps ({shards}) "
                      f"micro-batches; otherwise each step would train on {lo} sequences, not {self.batch_size}",
                      f"use a multiple of {shards}, e.g. {lo or hi} or {hi}")
