"""The harness's TrainerCallbacks: budget stop, metrics log + console line (checkpoint publishing:
harness.run.checkpoint_callback).

Small and single-purpose (TRL style). They share a RunContext that the train stage builds: the
run dir, the plan, this rank's ledger / trace / metrics logs and the token counters.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from harness import dist
from harness.halt import signal_name

if TYPE_CHECKING:
    from harness.run.context import RunContext

log = logging.getLogger("harness")


def _all_ranks_continue(ok: bool) -> bool:
    """A continue flag every rank agrees on (all must continue), so every rank stops at the same step."""
    return bool(dist.all_reduce_int(1 if ok else 0, "min"))


class BudgetCallback(TrainerCallback):
    """Stop after the last step whose successor could exceed the remaining token budget."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def on_step_end(self, args, state, control, **kwargs):
        c = self.ctx
        if c.round is None:  # the run samples nothing (its kind opened no generation round): no token budget
            return control
        # The successor (index state.global_step) samples only if it opens a new generation round; its worst
        # case is then the round's bound on this rank (every completion at max_completion_length).
        next_cost = c.round.token_bound // c.world if c.round.opens_round(state.global_step) else 0
        if not _all_ranks_continue(c.tokens_used + next_cost <= c.token_share):
            if state.global_step < state.max_steps:
                c.stopped_by_budget = True
                control.should_training_stop = True
                control.should_save = True  # the last step is a (permanent) checkpoint
                log.info("budget: stopping after step %d: %d tokens used, the next step could need %d more "
                         "(share %d)", state.global_step, c.tokens_used, next_cost, c.token_share)
        return control


class SignalCallback(TrainerCallback):
    """The learning-signal monitor (harness.run.learning.observe_round) after every step that sampled a round; rank 0
    says once when the reward can no longer move the policy. Training goes on (budget parity first)."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def on_train_begin(self, args, state, control, **kwargs):
        found = self.ctx.signal.finding if self.ctx.signal is not None else None
        if found is not None and self.ctx.rank == 0:  # established before a resume
            log.warning("NO LEARNING SIGNAL (before this resume): %s\n  %s", found["text"], found["fix"])
        return control

    def on_step_end(self, args, state, control, **kwargs):
        from harness.run.learning import observe_round

        found = observe_round(self.ctx)
        if found is not None and self.ctx.rank == 0:
            log.warning("NO LEARNING SIGNAL: %s\n  %s", found["text"], found["fix"])
        return control


def _agreed_signal(signum: int) -> int:
    """The signal any rank received (its number; 0 for none): every rank stops after the same step."""
    return dist.all_reduce_int(signum, "max")


class HaltCallback(TrainerCallback):
    """A planned stop (harness.halt): a signal received during training, or budget.stop_after_steps, ends
    training after this step with a checkpoint, on every rank. It runs after BudgetCallback: a stop at the
    step where training ends anyway publishes the final checkpoint (the next start only finalizes); a pause
    there is no pause."""

    def __init__(self, ctx: RunContext, halt, stop_after_steps: int | None):
        self.ctx, self.halt, self.stop_after = ctx, halt, stop_after_steps

    def on_step_end(self, args, state, control, **kwargs):
        signum = _agreed_signal(self.halt.signum or 0)
        step = state.global_step
        ends = control.should_training_stop or step >= state.max_steps
        paused = self.stop_after is not None and step >= self.stop_after and not ends
        if not (signum or paused):
            return control
        self.ctx.halted = {"status": "interrupted" if signum else "paused", "step": step, "signum": signum or None}
        control.should_save = True
        control.should_training_stop = True
        why = f"{signal_name(signum)} received" if signum else f"budget.stop_after_steps={self.stop_after}"
        log.info("%s: stopping after step %d with a checkpoint", why, step)
        return control


NONFINITE_TEST_ENV = "HARNESS_TEST_NONFINITE_STEPS"  # tests only: "3,5" makes those steps' gradients NaN


def _grads_finite(model) -> bool:
    import torch

    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()) if grads else True


def _no_step(closure=None):
    return None


class NonFiniteCallback(TrainerCallback):
    """A step whose gradient is not finite (a NaN or inf loss or gradient) is not applied: the optimizer's step and
    the scheduler's are skipped (Accelerate's skipped-step flag, the one a mixed-precision overflow sets), the
    step is counted (ctx.nonfinite_steps: metrics, checkpoint totals, completion.json; it survives resume) and
    its sampled tokens still count in the budget (the ledger has them). Over train.max_nonfinite_steps, training
    stops without a new checkpoint: the newest one stays intact, and the train stage raises NonFiniteError."""

    def __init__(self, ctx: RunContext, max_nonfinite: int):
        import os

        self.ctx, self.max = ctx, max_nonfinite
        self.inject = {int(s) for s in os.environ.get(NONFINITE_TEST_ENV, "").split(",") if s.strip()}
        self.skipped_here: list[int] = []
        self._skipping = None  # (the accelerated optimizer, the inner step it had) while a step is skipped

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        step = state.global_step + 1  # the step being taken
        if step in self.inject:
            next(p for p in model.parameters() if p.grad is not None).grad.fill_(float("nan"))
        if _all_ranks_continue(_grads_finite(model)):
            return control
        inner = optimizer.optimizer
        self._skipping = (optimizer, inner.__dict__.get("step"))
        inner.step = _no_step  # AcceleratedOptimizer.step calls it: no parameter or state update
        optimizer._is_overflow = True  # -> accelerator.optimizer_step_was_skipped: the Trainer skips the scheduler
        self.ctx.nonfinite_steps += 1
        self.skipped_here.append(step)
        log.warning("step %d: the gradient is not finite; the update was skipped (%d such step(s), "
                    "train.max_nonfinite_steps=%d)", step, self.ctx.nonfinite_steps, self.max)
        return control

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._skipping is not None:
            optimizer, prev = self._skipping
            if prev is None:
                del optimizer.optimizer.step
            else:
                optimizer.optimizer.step = prev
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._skipping is not None:
            self._skipping[0]._is_overflow = False
            self._skipping = None
        if self.ctx.nonfinite_steps > self.max:
            self.ctx.nonfinite_abort = list(self.skipped_here)
            control.should_training_stop = True
            control.should_save = False  # the newest checkpoint is the last good state
        return control


def training_ends_here(ctx: RunContext, state, control) -> bool:
    """After this step training is over for good (the budget, max_steps or TRL's own stop; not a planned stop that
    a later start continues): its checkpoint is the run's final, permanent one."""
    step = state.global_step
    return ctx.stopped_by_budget or step >= state.max_steps or (control.should_training_stop and ctx.halted is None)


class FirstStepCallback(TrainerCallback):
    """The time to this process's first completed optimizer step (a start phase, harness.run.recipe.Phases)."""

    def __init__(self, clock):
        self.clock, self.done = clock, False

    def on_step_end(self, args, state, control, **kwargs):
        if not self.done:
            self.done = True
            self.clock.mark("first_step")
        return control


class WatchdogCallback(TrainerCallback):
    """The hang watchdog (harness.diagnostics, train.hang_timeout_s): armed for training, re-armed by every step."""

    def __init__(self, dumps):
        self.dumps = dumps

    def on_train_begin(self, args, state, control, **kwargs):
        self.dumps.arm()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.dumps.step_done()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.dumps.disarm()
        return control


def console_line(step: int, max_steps: int, logs: dict, ctx: RunContext) -> str:
    kind = ctx.plan.kind
    parts = [kind.console_step(step, max_steps)]
    for key, label in (("reward", "reward"), ("loss", "loss"), ("mean_token_accuracy", "tok-acc"),
                       ("eval_accuracy", "eval acc")):
        if key in logs:
            parts.append(f"{label} {logs[key]:.3f}")
    budget = kind.console_budget(ctx)
    if budget:
        parts.append(budget)
    if ctx.step_clock is not None:  # training only: not the data, model build or eval before, nor earlier starts
        t0, first = ctx.step_clock
        parts.append(f"{(time.time() - t0 - ctx.eval_s) / max(step - first, 1):.2f} s/step")
    return " | ".join(parts)


class MetricsCallback(TrainerCallback):
    """One metrics.jsonl row per logged step (rank 0) and one concise console line."""

    def __init__(self, ctx: RunContext, console: bool = True):
        self.ctx, self.console = ctx, console
        self.last_logged_step = -1

    def on_step_begin(self, args, state, control, **kwargs):
        if self.ctx.step_clock is None:  # (on_train_begin comes before a resumed state is loaded)
            self.ctx.step_clock = (time.time(), state.global_step)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_runtime" in logs or not state.is_world_process_zero:
            return control  # the end-of-training summary goes to completion.json, not a step row
        if state.global_step == self.last_logged_step:
            return control  # e.g. eval logs at the same step: one row per step
        self.last_logged_step = state.global_step
        pending = self.ctx.pending_eval
        if pending is not None and pending[0] == state.global_step:  # a periodic eval of this step (PeriodicEval)
            logs.update(pending[1])  # (PeriodicEval clears it at its save: one row per step, so no second use)
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        row.update(self.ctx.plan.kind.metrics_fields(self.ctx))
        if self.ctx.nonfinite_steps:
            row["nonfinite_steps"] = self.ctx.nonfinite_steps
        if self.ctx.metrics is not None:
            self.ctx.metrics.append(row)
            self.ctx.metrics.flush()
        if self.console:
            log.info(console_line(state.global_step, state.max_steps, logs, self.ctx))
        return control


class TrackioCallback(TrainerCallback):
    """Every logged row into the run's open trackio run (harness.trackers.open_trackio), named as Transformers
    names them for W&B (train/*, eval/*): transformers' own TrackioCallback would re-open the run as a run of
    its TrainingArguments (no group, no harness config). Rank 0."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or "train_runtime" in (logs or {}):
            return control  # (the end-of-training summary: completion.json's figures follow at the end)
        import trackio
        from transformers.integrations.integration_utils import rewrite_logs

        scalars = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        if scalars:
            trackio.log(rewrite_logs(scalars), step=state.global_step)
        return control


class QuietProgressCallback(ProgressCallback):
    """TRL's progress bar without printing every logs dict (MetricsCallback prints one line). For RL arms the bar
    counts sampled tokens against the budget, which is what stops the run (max_steps is only a cap: a bar of
    max_steps would show 2000 steps and a tenfold ETA)."""

    def __init__(self, ctx: RunContext | None = None):
        super().__init__()
        self.ctx = ctx

    def _tokens(self) -> tuple[int, int] | None:
        """(sampled tokens so far, the ceiling) when the run's kind counts its progress in tokens; None: steps.
        Approximate across ranks for display; the ledgers are exact."""
        return None if self.ctx is None else self.ctx.plan.kind.token_progress(self.ctx)

    def on_train_begin(self, args, state, control, **kwargs):
        tokens = self._tokens()
        if tokens is None:
            return super().on_train_begin(args, state, control, **kwargs)
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.training_bar = tqdm(total=tokens[1], initial=tokens[0], unit="tok", desc="sampled tokens",
                                     dynamic_ncols=True)
        self.current_step = tokens[0]

    def on_step_end(self, args, state, control, **kwargs):
        tokens = self._tokens()
        if tokens is None:
            return super().on_step_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.update(tokens[0] - self.current_step)
            self.training_bar.set_postfix_str(f"step {state.global_step}", refresh=False)
            self.current_step = tokens[0]

    def on_log(self, args, state, control, logs=None, **kwargs):
        return control
