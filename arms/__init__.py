"""The arm registry: one entry per arm; its key, conf/arm/<name>.yaml and arms/<name>.py share the name.

Torch-free: the planner reads it. Trainer classes are imported lazily by `load_trainer` inside the
process that trains.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ArmSpec:
    name: str
    rl: bool  # samples completions (token budget, ledger) vs supervised (loss-token cap)
    summary: str

    @property
    def module(self) -> str:
        return f"arms.{self.name}"


ARMS: dict[str, ArmSpec] = {
    spec.name: spec
    for spec in (
        ArmSpec("sft", rl=False, summary="TRL SFTTrainer, completion-only loss, loss-token cap"),
        ArmSpec("grpo", rl=True, summary="TRL GRPOTrainer with the harness reward function"),
        ArmSpec("papo", rl=True, summary="GRPO + implicit perception loss on masked images (arXiv 2507.06448)"),
        ArmSpec("evi_po", rl=True, summary="GRPO + direction and evidence terms over an item's views (ARMS.md)"),
    )
}


def build_trainer(name: str, ctx):
    """The arm's TRL trainer, built from an arms.common.BuildContext (imports torch and trl)."""
    return importlib.import_module(ARMS[name].module).build_trainer(ctx)
