"""The W&B run of a harness run (logger.wandb): opened by the harness with the run's identity, kept open through
the final eval, finished once the run ends (completed, interrupted or failed).

    name    the run name (`grpo-tiny_vlm-synthetic-s0-6c7a0941`), also the W&B run id's source: a resumed run
            continues the same W&B run (resume="allow")
    group   the condition: arm + a digest of the semantic config without the seed (the seeds of one condition,
            as `python -m harness.report` groups them)
    tags    arm, seed-<n>, the model, its tuning, the arm's kind
    config  the harness plan (config, identity, budget) under `harness`; TRL adds its TrainingArguments

Transformers' WandbCallback logs the train/* series into this run (it reuses an open run); the harness adds
eval/* (before and after) and budget/* at the end, also in the run's summary (and, with logger.tensorboard,
into the run's TensorBoard events). Rank 0 only.

The trackio run of a harness run (logger.trackio) has the same name, group and config (the tags are in its config:
trackio has none). Its database is `<TRACKIO_DIR>/<logger.trackio_project>.db`, TRACKIO_DIR defaulting to
`<output_root>/trackio`: every run under one output_root (a sweep's) side by side in one dashboard. The
harness's TrackioCallback (harness.run.callbacks) logs every step's row, eval/* and budget/* at the end, as for W&B.
A resumed run continues its trackio run (resume="allow"); steps logged after the checkpoint it resumes from
appear twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import sys

from harness.identity import canonical_json, drop_paths

log = logging.getLogger("harness")


def condition_group(plan) -> str:
    """`<arm>-<12 hex>`: equal for runs that differ only in their seed (and in non-semantic fields)."""
    cfg = drop_paths(plan.config, plan.identity.get("non_semantic_fields") or [])
    cfg = {k: v for k, v in cfg.items() if k != "seed"}
    return f"{plan.arm}-{hashlib.sha256(canonical_json(cfg).encode()).hexdigest()[:12]}"


def wandb_id(run_name: str) -> str:
    return hashlib.sha256(run_name.encode()).hexdigest()[:32]  # W&B ids: [a-z0-9], at most 64


def open_wandb(plan, run_dir) -> None:
    """Start (or, on a resume, continue) the run's W&B run before the Trainer is built."""
    import wandb

    c, lg = plan.config, plan.cfg.logger  # c: the serialized config W&B records
    if wandb.run is not None:
        wandb.finish()  # a previous job's run in this process (a basic-launcher sweep)
    offline = lg.wandb_mode == "offline"
    if offline:  # TRL asks for the run's URL at every save: one warning per checkpoint; W&B's notes go to its log
        wandb.setup(settings=wandb.Settings(silent=True))
    run = wandb.init(project=lg.wandb_project, mode=lg.wandb_mode, dir=str(run_dir), id=wandb_id(plan.run_name),
               resume="allow", name=plan.run_name, group=condition_group(plan), tags=tags(plan),
               config={"harness": {"config": c, "identity": plan.identity, "budget": plan.budget}})
    if offline:
        log.info("wandb: offline run %s (group %s) in %s; upload it with `wandb sync %s`", run.name, run.group,
                 run.settings.sync_dir, run.settings.sync_dir)


def tags(plan) -> list[str]:
    cfg = plan.cfg
    return [cfg.arm.name, f"seed-{cfg.seed}", cfg.model.name, cfg.model.tuning.value, str(plan.kind)]


def trackio_dir(plan) -> str:
    """Where this process's trackio writes: TRACKIO_DIR as trackio read it at import, else <output_root>/trackio."""
    trackio = sys.modules.get("trackio")
    if trackio is not None:
        return str(trackio.utils.TRACKIO_DIR)
    return os.path.abspath(os.environ.get("TRACKIO_DIR") or os.path.join(plan.cfg.output_root, "trackio"))


def open_trackio(plan) -> None:
    """Start (or, on a resume, continue) the run's trackio run before the Trainer is built. trackio's own banner
    (7 lines, ANSI colours) is replaced by one line that says where the run is and how to look at it."""
    where = trackio_dir(plan)
    os.environ.setdefault("TRACKIO_DIR", where)  # read once, when trackio is imported
    import trackio

    lg = plan.cfg.logger
    if trackio.context_vars.current_run.get() is not None:
        _quiet(trackio.finish)  # a previous job's run in this process (a basic-launcher sweep)
    _quiet(trackio.init, project=lg.trackio_project, name=plan.run_name, group=condition_group(plan),
           resume="allow", embed=False, auto_log_cpu=False, auto_log_gpu=False,
           config={"harness": {"config": plan.config, "identity": plan.identity, "budget": plan.budget},
                   "tags": tags(plan)})
    log.info("trackio: run %s (group %s) in %s/%s.db; look at it with `TRACKIO_DIR=%s trackio show --project %s`",
             plan.run_name, condition_group(plan), where, lg.trackio_project, where, lg.trackio_project)


def _quiet(fn, **kwargs):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(**kwargs)


def final_scalars(completion: dict) -> dict:
    """eval/* (before and after, overall and per relation) and budget/* of a finished run (completion.json)."""
    out = {}
    for key in ("eval_before", "eval_after"):
        ev = completion.get(key) or {}
        label = "before" if key == "eval_before" else "after"
        for metric in ("accuracy", "format_valid", "direction_accuracy"):
            if ev.get(metric) is not None:
                out[f"eval/{metric}_{label}"] = ev[metric]
        for rel, b in (ev.get("per_relation") or {}).items():
            if b.get("accuracy") is not None:
                out[f"eval/{rel}/accuracy_{label}"] = b["accuracy"]
    for k in ("realized_completion_tokens", "completion_token_ceiling", "realized_loss_tokens", "loss_token_ceiling",
              "optimizer_steps", "nonfinite_steps"):
        if completion.get(k) is not None:
            out[f"budget/{k}"] = completion[k]
    return out


def log_completion(completion: dict) -> None:
    """The final scalars into the open W&B run's history and summary (with what stopped the run), and into the
    open trackio run at the last step (trackio has no summary)."""
    out = final_scalars(completion)
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.log(out)
        wandb.run.summary.update({**out, "budget/stopped_by": completion.get("stopped_by")})
    trackio = sys.modules.get("trackio")
    if trackio is not None and trackio.context_vars.current_run.get() is not None:
        trackio.log(out, step=completion.get("optimizer_steps") or 0)


def log_tensorboard(run_dir, completion: dict) -> None:
    """The final scalars into the run's TensorBoard events (next to TRL's train/* series), at the last step."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(run_dir / "tensorboard")) as writer:
        for key, value in final_scalars(completion).items():
            writer.add_scalar(key, value, global_step=completion.get("optimizer_steps") or 0)


def finish(failed: bool) -> None:
    """Finish this process's W&B and trackio runs if open (also on failure: the next job of a sweep has its own)."""
    trackio = sys.modules.get("trackio")
    if trackio is not None and trackio.context_vars.current_run.get() is not None:
        _quiet(trackio.finish)  # flushes its queue into the database
    wandb = sys.modules.get("wandb")
    if wandb is None or getattr(wandb, "run", None) is None:
        return
    wandb.finish(exit_code=1 if failed else 0)
    wandb.teardown()  # its settings (the run dir) are cached process-wide
