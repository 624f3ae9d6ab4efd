"""The harness's checkpoint publisher: after the Trainer saved checkpoint-<step>, bind the accounting frontier,
record the state and file digests, publish the manifest, apply retention (harness.accounting.checkpoint)."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import TrainerCallback

from harness import dist
from harness.accounting import checkpoint as ckpt
from harness.run.callbacks import training_ends_here
from harness.run.context import RunContext
from harness.faults import point

log = logging.getLogger("harness")


class CheckpointCallback(TrainerCallback):
    """After the Trainer saved checkpoint-<step>: bind the frontier, record digests, publish, retain.

    From train begin a Recorder (harness.accounting.tensorfiles) watches the Trainer write its checkpoints: each
    tensor's bytes are hashed once, for the state digests and the file digests both."""

    def __init__(self, ctx: RunContext, keep_last: int, totals=dict):
        # totals(): the trainer's own counters every checkpoint records (e.g. SFT: loss tokens so far; TrainerLink)
        self.ctx, self.keep_last, self.trainer_totals = ctx, keep_last, totals
        self.published: list[int] = []
        self.recorder = None

    def on_train_begin(self, args, state, control, **kwargs):
        from harness.accounting import tensorfiles

        self.recorder = tensorfiles.start(args.output_dir)
        return control

    def file_digest(self, path) -> str:
        """A checkpoint file's digest as publish records it (hashed once, as the Trainer wrote it)."""
        return self.recorder.file_digest(path)

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.close()
        return control

    def on_save(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        try:
            return self._publish(args, state, control, model, optimizer, lr_scheduler)
        finally:
            if self.recorder is not None:
                self.recorder.forget()  # the next step changes the memory these digests describe

    def _publish(self, args, state, control, model, optimizer, lr_scheduler):
        from harness.accounting.statedigest import fill_memo, optimizer_state, state_digests

        step = state.global_step
        ckpt_dir = Path(args.output_dir) / f"checkpoint-{step}"
        memo = self.recorder.memo if self.recorder is not None else None
        if memo is not None:  # the optimizer state (the weights are in it already, as written): on threads
            fill_memo([optimizer_state(optimizer)], memo)
        mine = {"frontier": self.ctx.frontier(), "state": state_digests(model, optimizer, lr_scheduler, memo=memo),
                "totals": {"completion_tokens": self.ctx.tokens_used, "completions": self.ctx.completions,
                           **self.trainer_totals()}}
        # Every rank saved its part of the checkpoint (e.g. its RNG state) before this gather: rank 0 then
        # digests the files and publishes with every rank's frontier, state digests and counters.
        everyone = dist.all_gather(mine)
        if not state.is_world_process_zero:
            return control
        # the run's final checkpoint (permanent): training ends here, by the budget, max_steps or TRL's own
        # stop; a planned stop (a signal, a pause) before that end is a resumable checkpoint like the others
        final = training_ends_here(self.ctx, state, control)
        every = self.ctx.plan.cfg.train.eval_steps
        kept = "eval" if not final and every and step % every == 0 else None  # a periodic eval's (not rotated)
        # counters of this rank's work add up over ranks; a TRL counter that TRL itself gathers over ranks
        # ("trl_" prefix) is the same on every rank: rank 0's value, not a sum
        totals = {k: mine["totals"][k] if k.startswith("trl_") else sum(e["totals"].get(k, 0) for e in everyone)
                  for k in mine["totals"]}
        point(f"{self.ctx.plan.kind}.checkpoint")  # tests only (harness.faults): a crash inside the save
        files = (self.recorder.checkpoint_files(ckpt_dir, {"optimizer.pt": optimizer_state(optimizer)})
                 if self.recorder is not None else None)
        ckpt.publish(
            ckpt_dir, step=step, identity=self.ctx.plan.identity,
            frontier={f"rank-{r}": e["frontier"] for r, e in enumerate(everyone)},
            state={f"rank-{r}": e["state"] for r, e in enumerate(everyone)},
            totals={**totals, "loss_tokens": self.ctx.loss_tokens, "stopped_by_budget": self.ctx.stopped_by_budget,
                    "nonfinite_steps": self.ctx.nonfinite_steps},
            rank_totals={f"rank-{r}": e["totals"] for r, e in enumerate(everyone)} if len(everyone) > 1 else None,
            permanent=final, kept=kept, files=files,
        )
        self.published.append(step)
        removed = ckpt.apply_retention(self.ctx.run_dir, self.keep_last)
        log.info("checkpoint %d published%s%s", step, " (final)" if final else "",
                 f"; removed {', '.join(removed)}" if removed else "")
        return control
