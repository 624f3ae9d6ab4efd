"""The train stage: this rank's logs opened at the resume point's frontiers, the init policy evaluated
(RL arms, fresh runs), the arm's TRL trainer built from the registry with the harness callbacks (budget,
metrics, checkpoints; the resume audit on resume), and trained. Every logger is closed, also on failure."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from arms import build_trainer
from arms.common import LOGGER_ENV, BuildContext, trainer_totals
from harness import dist
from harness.accounting.logs import METRICS_PATH, AppendLog, Frontier, ledger_path, trace_path
from harness.callbacks import (BudgetCallback, CheckpointCallback, FirstStepCallback, HaltCallback, MetricsCallback,
                               NonFiniteCallback, QuietProgressCallback, RunContext, TrackioCallback,
                               WatchdogCallback)
from harness.errors import NonFiniteError, Problem
from harness.diagnostics import StackDumps
from harness.halt import Halt, Halted
from harness.policy import Policy, device_of
from harness.stages.resume import ResumePoint, load_final_weights, load_full_weights_strictly, stock_resume

log = logging.getLogger("harness")


@dataclass(frozen=True)
class Trained:
    trainer: object  # the arm's TRL trainer, after training
    ctx: RunContext  # this rank's logs (closed) and counters
    train_out: object  # Trainer.train's output (metrics)
    evals: dict = field(default_factory=dict)  # {"before": result} when the init was evaluated here


def open_logs(plan, run_dir: Path, resume: ResumePoint) -> RunContext:
    """This rank's RunContext: metrics (rank 0), ledger and trace (RL) reopened at the checkpoint's frontier,
    and the counters the checkpoint recorded (no need to re-read the ledger)."""
    ctx = RunContext(run_dir=run_dir, plan=plan, rank=dist.rank(), world=dist.world_size())
    fr = resume.frontier(ctx.rank)
    opened = lambda key, rel: AppendLog(run_dir, rel, Frontier.from_json(fr[key]) if key in fr else None)  # noqa: E731
    ctx.metrics = opened("metrics", METRICS_PATH) if dist.is_main() else None
    ctx.nonfinite_steps = (resume.manifest.get("totals") or {}).get("nonfinite_steps", 0)
    if plan.rl:
        ctx.ledger, ctx.trace = opened("ledger", ledger_path(ctx.rank)), opened("trace", trace_path(ctx.rank))
        totals = resume.totals(ctx.rank)
        ctx.tokens_used, ctx.completions = totals.get("completion_tokens", 0), totals.get("completions", 0)
        ctx.token_share = plan.budget["completion_token_ceiling"] // ctx.world
        ctx.round = plan.round
    return ctx


def eval_policy(plan, run_dir: Path, data, policy: Policy, *, label: str, policy_ref: str, weights) -> dict:
    """Greedy eval of the live model on the plan's held-out split: eval/<split>[-label].json."""
    from harness.eval.greedy import write_eval
    from harness.policy import weights_digest

    res, preds = score_policy(plan, data, policy, label=label, policy_ref=policy_ref, policy_sha256=weights_digest(weights))
    write_eval(run_dir, res, preds)
    log.info("eval %s: accuracy %.3f on %d %s views", "after" if label == "final" else label, res["accuracy"],
             res["n"], plan.config["data"]["eval_split"])
    return res


def score_policy(plan, data, policy: Policy, *, label: str, policy_ref: str,
                 policy_sha256: str | None) -> tuple[dict, list[dict]]:
    """(artifact, predictions) of the live model's greedy eval on the plan's held-out split; writes nothing."""
    from harness.eval.greedy import evaluate

    c = plan.config
    return evaluate(policy.model, policy.processor, data.root, data.test_rows, plan=plan, split=c["data"]["eval_split"],
                    label=label, policy=policy_ref, rewards=plan_rewards(plan), is_vlm=c["model"]["is_vlm"],
                    max_new_tokens=c["train"]["eval_max_new_tokens"], batch_size=c["train"]["eval_batch_size"],
                    suppress_token_ids=policy.suppress_token_ids, eos_token_ids=policy.eos_token_ids,
                    # what makes the artifact comparable with a later `python -m harness.eval` of the same weights
                    extra=eval_settings(plan, data, policy_sha256))


def plan_rewards(plan):
    """The plan's reward functions, loaded once per process (eval before, training, periodic and final eval)."""
    from harness.reward_fns import Rewards

    if _REWARDS[0] is not plan:  # one slot: a sweep's next job in this process replaces the previous one's
        _REWARDS[:] = [plan, Rewards(plan.config["reward"], data_source=plan.config["data"]["name"])]
    return _REWARDS[1]


_REWARDS: list = [None, None]  # [the plan, its loaded Rewards]


def periodic_eval(plan, run_dir: Path, data, policy: Policy, ctx: RunContext):
    """train.eval_steps: the PeriodicEvalCallback of this run (its sink logger is set once the trainer exists)."""
    from harness.callbacks import PeriodicEvalCallback
    from harness.eval.greedy import write_eval

    def evaluate(step: int):
        ref = f"checkpoint-{step}"  # the weights digest is added at save time (harness.callbacks)
        return score_policy(plan, data, policy, label=ref, policy_ref=ref, policy_sha256=None)

    return PeriodicEvalCallback(ctx, plan.config["train"]["eval_steps"], evaluate=evaluate,
                                write=lambda result, preds: write_eval(run_dir, result, preds), log=None)


def eval_settings(plan, data, policy_sha256: str | None) -> dict:
    """What an eval artifact records besides its metrics, so that a later eval of the same weights can
    recognize it (harness.eval.REUSE_KEYS; `python -m harness.eval` reads policy_sha256 and max_items)."""
    c = plan.config
    return {"policy_sha256": policy_sha256, "max_items": c["data"]["eval_max_items"],
            "data_sha256": data.content_sha256, "reward": dict(c["reward"]),
            # the reward files as they are now (an SFT warm start's eval too: its identity leaves the reward out)
            "reward_sources": reward_sources(c["reward"])}


def reward_sources(reward: dict) -> dict:
    from harness.reward_fns import source_digests

    return source_digests(reward)


def eval_before(plan, run_dir: Path, data, policy: Policy, resume: ResumePoint) -> dict:
    """RL arms, fresh runs: the init policy on rank 0 (the other ranks hold the same weights; they wait).
    An SFT warm start's own final eval is reused when it evaluated these weights with these settings."""
    if not plan.rl or not plan.config["train"]["eval_before"] or resume.checkpoint is not None:
        return {}
    out = {}
    if dist.is_main():
        out["before"] = (reuse_parent_eval(plan, run_dir, data, policy)
                         or eval_policy(plan, run_dir, data, policy, label="before", policy_ref=policy.init["path"],
                                        weights=policy.init["path"]))
    dist.barrier()
    return out


def reuse_parent_eval(plan, run_dir: Path, data, policy: Policy) -> dict | None:
    """The parent's final eval as this run's eval before (written to eval/<split>-before.json with
    `reused_from`), when it scored the same weights (digest) with the same settings; else None."""
    import json

    from harness.eval import artifact_path, decoding, reuse_mismatches
    from harness.policy import weights_digest
    from harness.rundir import atomic_write_bytes, atomic_write_json, now

    if policy.init.get("kind") != "sft":
        return None
    c = plan.config
    src = artifact_path(policy.init["parent_run_dir"], c["data"]["eval_split"], "final")
    try:
        stored = json.loads(src.read_text())
    except (OSError, ValueError):
        return None
    wanted = {**eval_settings(plan, data, weights_digest(policy.init["path"])), "split": c["data"]["eval_split"],
              "decoding": decoding(c["train"]["eval_max_new_tokens"], c["train"]["eval_batch_size"]),
              "code": plan.identity.get("code")}
    diffs = reuse_mismatches(stored, wanted)
    if diffs:
        log.info("eval before: the SFT warm start's eval differs in %s; evaluating", ", ".join(diffs))
        return None
    out = artifact_path(run_dir, c["data"]["eval_split"], "before")
    out.parent.mkdir(parents=True, exist_ok=True)
    preds = src.with_suffix(".predictions.jsonl")
    if preds.is_file():
        atomic_write_bytes(out.with_suffix(".predictions.jsonl"), preds.read_bytes())
    res = {**stored, "label": "before", "policy": policy.init["path"], "run_name": plan.run_name,
           "identity": {k: plan.identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model", "code")},
           "created_at": now(), "wall_s": 0.0,
           "reused_from": {"artifact": str(src), "policy_sha256": stored["policy_sha256"],
                           "evaluated_at": stored.get("created_at"), "wall_s": stored.get("wall_s")}}
    atomic_write_json(out, res)
    log.info("eval before: accuracy %.3f on %d %s views (the SFT warm start's final eval of the same weights, "
             "sha256 %s..., reused)", res["accuracy"], res["n"], c["data"]["eval_split"], stored["policy_sha256"][:12])
    return res


def build(plan, run_dir: Path, data, policy: Policy, ctx: RunContext, resume: ResumePoint, halt: Halt | None = None,
          dumps: StackDumps | None = None):
    """The arm's trainer with the harness's callbacks, its counters restored on resume. `halt`: this process's
    stop request (harness.halt), read after every step; `dumps`: the stack dumps whose watchdog every step re-arms."""
    from transformers.trainer_callback import ProgressCallback

    from harness.smoke import install_kill_switch
    from harness.trainsets import rl_dataset, sft_dataset

    c = plan.config
    is_vlm = c["model"]["is_vlm"]
    if plan.rl:
        from harness.accounting.ledger import HarnessReward, provenance_of

        dataset = rl_dataset(data.root, data.train_rows, is_vlm=is_vlm)
        reward = HarnessReward(ctx, rewards=plan_rewards(plan), eos_token_ids=policy.eos_token_ids,
                               provenance=provenance_of(plan))
    else:
        from harness.trainsets import sft_passes

        passes = sft_passes(c["arm"], c["budget"]["max_steps"], len(data.train_rows))
        dataset = sft_dataset(data.root, data.train_rows, is_vlm=is_vlm, seed=c["seed"], passes=passes)
        reward = None
    checkpoints = CheckpointCallback(ctx, keep_last=c["train"]["keep_last"])
    periodic = periodic_eval(plan, run_dir, data, policy, ctx) if c["train"]["eval_steps"] else None
    callbacks = [BudgetCallback(ctx), HaltCallback(ctx, halt or Halt(), c["budget"]["stop_after_steps"]),
                 MetricsCallback(ctx, console=c["logger"]["console"]), *([periodic] if periodic else []), checkpoints]
    callbacks.append(NonFiniteCallback(ctx, c["train"]["max_nonfinite_steps"]))  # last: it can veto the save
    if dumps is not None:
        callbacks.append(WatchdogCallback(dumps))
    if c["logger"]["trackio"]:
        callbacks.append(TrackioCallback())
    bctx = BuildContext(plan=plan, run_dir=run_dir, model=policy.model, processor=policy.processor,
                        train_dataset=dataset, callbacks=callbacks, reward_fn=reward,
                        suppress_token_ids=policy.suppress_token_ids, device=device_of(plan), world=ctx.world)
    trainer = build_trainer(plan.arm, bctx)
    checkpoints.trainer_totals = lambda: trainer_totals(trainer)  # the counters protocol
    if periodic is not None:  # its eval_* values to every sink (TensorBoard, W&B; metrics.jsonl if not logged yet)
        periodic.log = lambda logs: trainer.callback_handler.on_log(trainer.args, trainer.state, trainer.control, logs)
    if resume.checkpoint is not None and hasattr(trainer, "restore_checkpoint_totals"):
        trainer.restore_checkpoint_totals(resume.totals(ctx.rank))
    if not plan.rl:
        ctx.loss_tokens = trainer.harness_loss_token_plan["loss_tokens"]
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(QuietProgressCallback(ctx))
    install_kill_switch(trainer, plan)
    return trainer


def train(plan, run_dir: Path, data, policy: Policy, resume: ResumePoint, clock,
          dumps: StackDumps | None = None) -> Trained:
    """`clock` (harness.lifecycle.Phases) gets the laps eval_before and train; `dumps` (harness.diagnostics): the
    run's stack dumps, whose hang watchdog training arms. A planned stop (a signal during training,
    budget.stop_after_steps) raises harness.halt.Halted once its checkpoint is published."""
    already_paused(plan, resume)
    ctx = open_logs(plan, run_dir, resume)
    evals = eval_before(plan, run_dir, data, policy, resume)
    clock.lap("eval_before")
    env_before = {k: os.environ.get(k) for k in LOGGER_ENV}
    halt = Halt()
    if plan.config["logger"]["wandb"] and dist.is_main():
        from harness.trackers import open_wandb

        open_wandb(plan, run_dir)  # with the run's identity; it stays open through the final eval (finalize)
    if plan.config["logger"]["trackio"] and dist.is_main():
        from harness.trackers import open_trackio

        open_trackio(plan)  # the same, into <output_root>/trackio
    trainer = build(plan, run_dir, data, policy, ctx, resume, halt=halt, dumps=dumps)
    trainer.add_callback(FirstStepCallback(clock))
    if resume.checkpoint is not None:
        from harness.audit import ResumeAuditCallback

        audit = ResumeAuditCallback(run_dir, resume.checkpoint, rank=ctx.rank)
        audit.attach(trainer)
        trainer.add_callback(audit)
        if plan.config["model"]["tuning"] == "full" and not stock_resume():
            load_full_weights_strictly(policy.model, resume.checkpoint)
    failed = True
    try:
        if resume.permanent:
            train_out = finish_from_final_checkpoint(plan, trainer, policy.model, resume, ctx)
        else:
            with halt:  # SIGTERM / SIGINT (/ a scheduler's signal) stop after the current step
                train_out = trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume.checkpoint else None)
        failed = False
    finally:  # also on failure: the next job of a sweep (same process) must not inherit open loggers
        close_loggers(trainer, ctx, env_before, failed=failed)
    dist.barrier()  # every rank's ledger and trace are closed (fsynced) before rank 0 reads them
    clock.lap("train")
    if ctx.nonfinite_abort is not None:
        raise nonfinite_error(plan, run_dir, ctx)
    if ctx.halted:
        h = ctx.halted
        raise Halted(h["status"], h["step"], f"checkpoint-{h['step']}", signum=h["signum"],
                     then=halt.scheduler_handler())
    return Trained(trainer=trainer, ctx=ctx, train_out=train_out, evals=evals)


def nonfinite_error(plan, run_dir: Path, ctx: RunContext) -> NonFiniteError:
    """Why training stopped over train.max_nonfinite_steps, which checkpoint is intact, and what to change."""
    from harness.accounting.checkpoint import complete_checkpoints

    newest = complete_checkpoints(run_dir)
    kept = f"the newest checkpoint {newest[-1].name} is intact" if newest else "no checkpoint was published yet"
    problem = Problem("train.max_nonfinite_steps", plan.config["train"]["max_nonfinite_steps"],
                      f"{ctx.nonfinite_steps} optimizer step(s) of this run had a non-finite gradient (in this process: "
                      f"steps {', '.join(map(str, ctx.nonfinite_abort))}); none was applied; training stopped and {kept}",
                      "lower arm.learning_rate, check model.dtype and the data; or raise train.max_nonfinite_steps to "
                      "skip more such steps")
    return NonFiniteError(f"NonFiniteError: {problem.render()}")


def already_paused(plan, resume: ResumePoint) -> None:
    """budget.stop_after_steps=N with a resumable checkpoint at step >= N: the run stays paused (nothing runs)."""
    stop_after = plan.config["budget"]["stop_after_steps"]
    step = resume.manifest.get("step") if resume.checkpoint is not None else None
    if stop_after is not None and step is not None and step >= stop_after and not resume.permanent:
        log.info("budget.stop_after_steps=%d: the run is at step %d already (%s); it stays paused. Run the same "
                 "command without budget.stop_after_steps to continue.", stop_after, step, resume.checkpoint.name)
        raise Halted("paused", step, resume.checkpoint.name)


def finish_from_final_checkpoint(plan, trainer, model, resume: ResumePoint, ctx: RunContext):
    """Killed after its final checkpoint: training is over. Trainer.train would take one more step (it checks
    max_steps at step end), so the final weights and state are restored (and audited) for finalize."""
    from transformers import TrainerState

    from harness.audit import ResumeAuditCallback

    checkpoint = resume.checkpoint
    log.info("%s is the run's final checkpoint: training is complete, finishing the run", checkpoint.name)
    load_final_weights(model, checkpoint, plan.config["model"]["tuning"])
    audit = ResumeAuditCallback(ctx.run_dir, checkpoint, rank=ctx.rank)
    audit.on_train_begin(None, None, None, model=model, optimizer=None, lr_scheduler=None)
    audit.finish(resume.manifest["step"], only=("params", "adapters"))
    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    ctx.stopped_by_budget = bool(resume.manifest["totals"].get("stopped_by_budget"))
    return SimpleNamespace(metrics={})


def close_loggers(trainer, ctx: RunContext, env_before: dict, *, failed: bool) -> None:
    """Close the harness's logs and TensorBoard writers, and restore the logger environment; a W&B run only on
    failure (else it stays open for the final eval: harness.trackers, finished when the run ends)."""
    for lg in (ctx.ledger, ctx.trace, ctx.metrics):
        if lg is not None:
            lg.close()
    for cb in trainer.callback_handler.callbacks:
        writer = getattr(cb, "tb_writer", None)
        if writer is not None:
            writer.close()
            cb.tb_writer = None
    if failed:
        from harness.trackers import finish

        finish(failed=True)
    for k, v in env_before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
