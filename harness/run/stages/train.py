"""The train stage: the arm's TRL trainer built from the registry with the harness callbacks (budget, metrics,
checkpoints, the periodic eval; the resume audit is harness.run.stages.resume's), what training leaves
(`Trained`), a run finished from its final checkpoint, and the error of too many non-finite gradients. The
recipe (harness.run.recipe) opens this rank's logs before and trains it."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from arms import build_trainer
from arms.common import BuildContext
from harness.run.callbacks import (BudgetCallback, FirstStepCallback, HaltCallback, MetricsCallback,
                                   NonFiniteCallback, QuietProgressCallback, SignalCallback, TrackioCallback,
                                   WatchdogCallback)
from harness.run.checkpoint_callback import CheckpointCallback
from harness.run.context import RunContext, TrainerLink
from harness.errors import NonFiniteError, Problem
from harness.diagnostics import StackDumps
from harness.eval.during import periodic_eval
from harness.halt import Halt
from harness.policy import Policy
from harness.run.stages.kind import kind_run
from harness.run.stages.resume import ResumePoint, load_final_weights

log = logging.getLogger("harness")


@dataclass(frozen=True)
class Trained:
    trainer: object  # the arm's TRL trainer, after training
    ctx: RunContext  # this rank's logs (closed) and counters
    train_out: object  # Trainer.train's output (metrics)
    evals: dict = field(default_factory=dict)  # {"before": result} when the init was evaluated here


def build(plan, run_dir: Path, data, policy: Policy, ctx: RunContext, resume: ResumePoint, halt: Halt | None = None,
          dumps: StackDumps | None = None, clock=None):
    """The arm's trainer with the harness's callbacks, its counters restored on resume. `halt`: this process's
    stop request (harness.halt), read after every step; `dumps`: the stack dumps whose watchdog every step re-arms;
    `clock` (harness.run.recipe.Phases): marked at this process's first optimizer step."""
    from transformers.trainer_callback import ProgressCallback

    from harness.faults import step_callbacks

    cfg = plan.cfg
    dataset, reward = kind_run(plan.kind).trainset(plan, data, policy, ctx)  # RL: prompts, and the ledger's reward function
    link = TrainerLink()  # the trainer, for the callbacks built before it (bound once, below)
    checkpoints = CheckpointCallback(ctx, keep_last=cfg.train.keep_last, totals=link.totals)
    # its eval_* values to every sink (TensorBoard, W&B; metrics.jsonl if not logged yet), its weights' digest as
    # publish records it
    periodic = (periodic_eval(plan, run_dir, data, policy, ctx, log=link.log, file_digest=checkpoints.file_digest)
                if cfg.train.eval_steps else None)
    callbacks = [BudgetCallback(ctx), HaltCallback(ctx, halt or Halt(), cfg.budget.stop_after_steps),
                 SignalCallback(ctx), MetricsCallback(ctx, console=cfg.logger.console),
                 *([periodic] if periodic else []), checkpoints]
    callbacks.append(NonFiniteCallback(ctx, cfg.train.max_nonfinite_steps))  # last: it can veto the save
    if dumps is not None:
        callbacks.append(WatchdogCallback(dumps))
    if cfg.logger.trackio:
        callbacks.append(TrackioCallback())
    if clock is not None:
        callbacks.append(FirstStepCallback(clock))
    callbacks += step_callbacks(plan.kind, plan.run_name)  # tests only (harness.faults): after the harness's own
    bctx = BuildContext(plan=plan, run_dir=run_dir, model=policy.model, processor=policy.processor,
                        train_dataset=dataset, callbacks=callbacks, reward_fn=reward,
                        suppress_token_ids=policy.suppress_token_ids, device=policy.device, world=ctx.world)
    trainer = build_trainer(plan.arm, bctx)
    link.bind(trainer)
    if resume.checkpoint is not None and hasattr(trainer, "restore_checkpoint_totals"):
        trainer.restore_checkpoint_totals(resume.totals(ctx.rank))
    kind_run(plan.kind).built(trainer, ctx)  # SFT: the loss tokens its trainer planned
    trainer.remove_callback(ProgressCallback)  # Trainer.__init__ adds its bar after the callbacks it is given
    if sys.stderr.isatty():  # a bar for a terminal; in a log file its frames would glue onto the step lines
        trainer.add_callback(QuietProgressCallback(ctx))
    return trainer


def nonfinite_error(plan, run_dir: Path, ctx: RunContext) -> NonFiniteError:
    """Why training stopped over train.max_nonfinite_steps, which checkpoint is intact, and what to change."""
    from harness.accounting.checkpoint import complete_checkpoints

    newest = complete_checkpoints(run_dir)
    kept = f"the newest checkpoint {newest[-1].name} is intact" if newest else "no checkpoint was published yet"
    problem = Problem("train.max_nonfinite_steps", plan.cfg.train.max_nonfinite_steps,
                      f"{ctx.nonfinite_steps} optimizer step(s) of this run had a non-finite gradient (in this process: "
                      f"steps {', '.join(map(str, ctx.nonfinite_abort))}); none was applied; training stopped and {kept}",
                      "lower arm.learning_rate, check model.dtype and the data; or raise train.max_nonfinite_steps to "
                      "skip more such steps")
    return NonFiniteError(f"NonFiniteError: {problem.render()}")


def finish_from_final_checkpoint(plan, trainer, model, resume: ResumePoint, ctx: RunContext):
    """Killed after its final checkpoint: training is over. Trainer.train would take one more step (it checks
    max_steps at step end), so the final weights and state are restored (and audited) for finalize."""
    from transformers import TrainerState

    from harness.run.audit import ResumeAuditCallback

    checkpoint = resume.checkpoint
    resume.confirm()
    log.info("%s is the run's final checkpoint: training is complete, finishing the run", checkpoint.name)
    load_final_weights(model, checkpoint, plan.cfg.model.tuning.value)
    audit = ResumeAuditCallback(ctx.run_dir, checkpoint, rank=ctx.rank)
    audit.on_train_begin(None, None, None, model=model, optimizer=None, lr_scheduler=None)
    audit.finish(resume.manifest["step"], only=("params", "adapters"))
    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    return SimpleNamespace(metrics={})
