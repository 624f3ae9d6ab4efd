"""What every arm shares: its registry entry (ArmSpec), the build context of its trainer and the
TrainingArguments fields taken from the plan.

Torch-free at import (the registry is read by the planner); trainers import TRL in arms/<name>/trainer.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from harness import kinds

@dataclass(frozen=True)
class ArmSpec:
    """One arm's registry entry, `ARM` in arms/<name>/__init__.py (torch-free).

    name     the arm's key: arm=<name>, conf/arm/<name>.yaml, arms/<name>/
    kind     sft (supervised, loss-token cap) | rl (samples completions: token budget, ledger, trace); given
             by name, kept as its object (harness.kinds.of: what the kind decides, everywhere, one place each)
    config   the arm's config dataclass (extends harness.config.fields.ArmConfig), the only declaration of
             its knobs; its `check(cfg, out)` adds the arm's plan-time rules
    summary  one line for --help and the report
    trainer  the module with `build_trainer(ctx: BuildContext)` (imports torch and trl; loaded lazily)
    color    the arm's colour in the report's plots (a matplotlib colour), or None for the next free one
    """

    name: str
    kind: kinds.Kind
    config: type
    summary: str
    trainer: str = ""
    color: str | None = None

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", kinds.of(self.kind))
        except ValueError as exc:
            raise ValueError(f"arm {self.name}: {exc}") from None
        if not self.trainer:
            object.__setattr__(self, "trainer", f"arms.{self.name}.trainer")


@dataclass
class BuildContext:
    """Everything an arm needs to build its TRL trainer (`build_trainer(ctx)` in arms/<name>/trainer.py).

    The trainer may carry two optional methods, the counters protocol: `checkpoint_totals() -> dict` (this
    rank's counters every checkpoint records next to the harness's own) and `restore_checkpoint_totals(d)`
    (called on resume with what the checkpoint recorded). An sft-kind trainer also sets
    `harness_loss_token_plan` (rows, loss_tokens, steps, per_row, limit): what its loss-token cap admits.
    """

    plan: Any  # harness.plan.Plan
    run_dir: Path
    model: Any
    processor: Any  # processor (VLM) or tokenizer (LM)
    train_dataset: Any  # datasets.Dataset in the arm's format
    callbacks: list = field(default_factory=list)
    reward_fn: Any = None  # RL arms: the harness reward function (ledger + trace)
    suppress_token_ids: list[int] = field(default_factory=list)
    device: str = "cpu"
    world: int = 1

    @property
    def output_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def trainer_totals(trainer) -> dict:
    """The trainer's own counters (the counters protocol of BuildContext), or none."""
    totals = getattr(trainer, "checkpoint_totals", None)
    return totals() if totals else {}


LOGGER_ENV = ("TENSORBOARD_LOGGING_DIR", "WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR")


def training_kwargs(ctx: BuildContext) -> dict:
    """TrainingArguments fields shared by every arm, straight from the plan."""
    c = ctx.plan.cfg
    a, t, lg = c.arm, c.train, c.logger
    report_to = [name for name, on in (("tensorboard", lg.tensorboard), ("wandb", lg.wandb)) if on]
    if lg.tensorboard:  # transformers 5 takes the directory from the environment
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(ctx.run_dir / "tensorboard")
    if lg.wandb:
        os.environ["WANDB_MODE"] = lg.wandb_mode  # the run's config, not a previous job's (multirun)
        os.environ["WANDB_PROJECT"] = lg.wandb_project
        os.environ["WANDB_DIR"] = str(ctx.run_dir)
    on_gpu = ctx.device.startswith("cuda")
    return dict(
        output_dir=str(ctx.output_dir),
        learning_rate=a.learning_rate,
        lr_scheduler_type=a.lr_scheduler_type.value,
        warmup_steps=a.warmup_ratio,  # a float in [0, 1) is a ratio of the planned steps
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        gradient_checkpointing=c.model.gradient_checkpointing,  # TRL's configs default it to True
        gradient_accumulation_steps=a.gradient_accumulation_steps,
        max_steps=c.budget.max_steps,
        logging_steps=t.logging_steps,
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=None,  # retention is the harness's (latest K complete + permanent)
        seed=c.seed,
        data_seed=c.seed,
        use_cpu=not on_gpu,
        # Ranks may run different numbers of forwards through the DDP model in a step (evi_po's direction
        # term runs only where a view's owner row is): with buffer broadcasts per forward, the ranks'
        # collectives would no longer pair up and the job hangs (measured). The buffers here are constants.
        ddp_broadcast_buffers=False,
        ddp_timeout=c.placement.collective_timeout_s,  # the process group is made first (harness.dist.init), alike
        bf16=on_gpu and c.model.dtype == "bfloat16",  # on CPU: no bf16 autocast (~50% slower, docs/platform.md)
        fp16=False,
        report_to=report_to,
        dataloader_num_workers=c.data.num_workers,
        remove_unused_columns=False,  # the reward function reads the record columns
        disable_tqdm=False,
    )
