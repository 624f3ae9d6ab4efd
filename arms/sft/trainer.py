"""sft: TRL's SFTTrainer, completion-only loss, and the loss-token cap (docs/arms.md sft).

The cap takes the longest prefix of the planned passes over the training split (harness.data.trainsets.sft_order:
arm.epochs, or as many as budget.max_steps needs, each in its own seeded order) whose loss-bearing tokens fit in
budget.max_loss_tokens (and whose batches fit in budget.max_steps). Loss tokens are counted
with the trainer's own collator, one row at a time, exactly as it masks them during training
(labels != -100, past the first position that no token predicts). The subclass counts again,
batch by batch, what compute_loss actually trains on, so the two can be compared.
"""

from __future__ import annotations

import math

from trl import SFTConfig, SFTTrainer

from arms.common import BuildContext, training_kwargs
from arms.trl_hooks import set_sft_token_count, sft_token_count


def loss_tokens(labels) -> int:
    """Tokens a causal-LM loss trains on: labels shifted by one, ignore_index -100 excluded."""
    return int((labels[..., 1:] != -100).sum())


class HarnessSFTTrainer(SFTTrainer):
    """SFTTrainer that counts the loss tokens it trains on (optimizer steps only)."""

    trained_loss_tokens: int = 0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and "labels" in inputs:
            self.trained_loss_tokens += loss_tokens(inputs["labels"])
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    # the trainer side of the checkpoint totals (arms.common.BuildContext: the counters protocol)

    def checkpoint_totals(self) -> dict:
        """This rank's counters a checkpoint records: `trl_` keys are TRL's own (rank 0's value is kept)."""
        return {"trained_loss_tokens": self.trained_loss_tokens,
                "trl_sft_total_train_tokens": sft_token_count(self)}

    def restore_checkpoint_totals(self, totals: dict) -> None:
        """Continue this rank's counts from a checkpoint's totals (resume)."""
        self.trained_loss_tokens = totals.get("trained_loss_tokens", 0)
        set_sft_token_count(self, totals.get("trl_sft_total_train_tokens", 0))


def build_trainer(ctx: BuildContext):
    a = ctx.plan.cfg.arm
    per_device = a.batch_size // (ctx.world * a.gradient_accumulation_steps)  # the plan refused a remainder
    args = SFTConfig(
        **training_kwargs(ctx),
        per_device_train_batch_size=per_device,
        max_length=a.max_length,
        completion_only_loss=a.completion_only_loss,
        shuffle_dataset=False,  # the harness fixed the epoch's order (seeded) before the cap
        dataloader_drop_last=False,
    )
    trainer = HarnessSFTTrainer(
        model=ctx.model, args=args, train_dataset=ctx.train_dataset, processing_class=ctx.processor,
        callbacks=ctx.callbacks,
    )
    apply_loss_token_cap(trainer, ctx)
    return trainer


CAP_CHUNK = 64  # rows collated at once while counting: one processor call per chunk instead of per row


def row_loss_tokens(batch) -> tuple[list[int], list[int]]:
    """(each row's length, each row's loss tokens) of a collated batch: the counts a one-row batch of each row
    gives. TRL's prompt-completion collator flushes every row left (tokens from position 0, padding after) before
    it truncates to max_length and masks padding with -100, so row r of a batch is its one-row batch followed by
    padding: its length is its mask's sum, its loss tokens `loss_tokens` of its own labels (position 0 excluded).
    tests/unit/test_sft_cap.py holds the two equal on the default data."""
    lengths = [int(x) for x in batch["attention_mask"].sum(dim=1)]
    counts = [int(x) for x in (batch["labels"][:, 1:] != -100).sum(dim=1)]
    return lengths, counts


def prefix_limit(max_steps: int, rows_per_step: int, rows: int) -> str:
    """What ends the planned rows when the loss-token cap does not (completion.json `stopped_by`): "max_steps" when
    budget.max_steps takes every row or fewer (a warm start's passes are sized by its steps, so its last step is
    also the end of its last pass: it stopped at its max steps), "epoch_end" when the planned passes (arm.epochs)
    end before budget.max_steps."""
    return "max_steps" if max_steps * rows_per_step <= rows else "epoch_end"


def apply_loss_token_cap(trainer, ctx: BuildContext, chunk: int = CAP_CHUNK) -> None:
    """Cut the (already seeded-shuffled) passes to the longest prefix that fits both caps.

    The rows are counted with the trainer's own collator, `chunk` rows per call (one row per call costs a processor
    call per row: 6.6 s of the default job's 150-step warm start); the counts are the one-row counts (row_loss_tokens)."""
    c = ctx.plan.cfg
    cap, max_steps = c.budget.max_loss_tokens, c.budget.max_steps
    rows_per_step = trainer.args.per_device_train_batch_size * ctx.world * trainer.args.gradient_accumulation_steps
    ds = trainer.train_dataset
    counts, total = [], 0
    max_len = c.arm.max_length
    limit = prefix_limit(max_steps, rows_per_step, len(ds))  # "budget" below when the loss-token cap cuts first
    n_rows = min(len(ds), max_steps * rows_per_step)
    for start in range(0, n_rows, chunk):
        rows = range(start, min(start + chunk, n_rows))
        lengths, ns = row_loss_tokens(trainer.data_collator([dict(ds[i]) for i in rows]))
        for i, length, n in zip(rows, lengths, ns):
            if length >= max_len:
                raise ValueError(
                    f"train row {i} is {length} tokens, at arm.max_length ({max_len}): it would be "
                    f"truncated and its loss tokens miscounted; raise arm.max_length"
                )
            if total + n > cap:
                limit = "budget"
                break
            counts.append(n)
            total += n
        else:
            continue
        break
    if not counts:
        raise ValueError(f"budget.max_loss_tokens ({cap}) is smaller than the first row's loss tokens")
    trainer.train_dataset = ds.select(range(len(counts)))
    steps = math.ceil(len(counts) / rows_per_step)
    trainer.args.max_steps = steps
    trainer.harness_loss_token_plan = {"rows": len(counts), "loss_tokens": total, "steps": steps,
                                       "per_row": counts, "limit": limit}
