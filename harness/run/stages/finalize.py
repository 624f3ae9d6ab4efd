"""The finalize stage: the final policy (every rank takes part in the save), every rank's counters
gathered, then on rank 0 the eval after training, the final policy's model card (harness.card), the push to
the Hub when train.push_to_hub, and completion.json, written last."""

from __future__ import annotations

import logging
import resource
import time

from arms.common import trainer_totals
from harness import dist
from harness.accounting.checkpoint import complete_checkpoints
from harness.eval import artifact_path, periodic_evals
from harness.eval.during import eval_policy
from harness.faults import point
from harness.models import imagecache
from harness.policy import save_final_policy
from harness.rundir import COMPLETION, RunDir, atomic_write_json, now, read_json
from harness.run.stages.kind import kind_run
from harness.run.stages.train import Trained

log = logging.getLogger("harness")


def finalize(plan, run: RunDir, data, policy, trained: Trained, started: float, clock) -> dict | None:
    """completion.json's content on rank 0 (written), None on the other ranks. `clock`
    (harness.run.recipe.Phases) gets the laps eval_after and finalize; its phases go into completion.json."""
    cfg, ctx, trainer = plan.cfg, trained.ctx, trained.trainer
    save_final_policy(trainer, run.path, base_path=policy.base_path, plan=plan)
    counts = {"rank": ctx.rank, "completion_tokens": ctx.tokens_used, "completions": ctx.completions}
    counts.update({k: v for k, v in trainer_totals(trainer).items() if not k.startswith("trl_")})
    ranks = dist.all_gather(counts)
    if not dist.is_main():
        return None  # rank 0 evaluates and finalizes; no collective follows
    evals = dict(trained.evals)
    clock.lap("finalize", mark=False)  # the final save and the gather; finalize goes on after the eval
    if cfg.train.eval_after:
        evals["after"] = eval_policy(plan, run.path, data, policy, label="final", policy_ref="final_policy",
                                     weights=run.path / "final_policy")
    clock.lap("eval_after")
    before = artifact_path(run.path, cfg.data.eval_split, "before")
    if "before" not in evals and before.is_file():  # a resumed run evaluated its init in an earlier process
        evals["before"] = read_json(before)
    return write_completion(plan, run, ctx=ctx, trainer=trainer, train_out=trained.train_out, evals=evals,
                            wall_s=time.time() - started, peak_rss_mb=_peak_rss_mb(), ranks=ranks, clock=clock,
                            image_cache=imagecache.stats(policy.processor))


def _eval_summary(result: dict | None) -> dict | None:
    if not result:
        return None
    keep = ("n", "accuracy", "abstention_rate", "format_valid", "truncated", "direction_accuracy", "split", "label",
            "policy", "policy_sha256", "reused_from")
    out = {k: result[k] for k in keep if k in result}
    out["per_relation"] = {rel: {k: v for k, v in b.items()} for rel, b in result.get("per_relation", {}).items()}
    return out


def write_completion(plan, run, *, ctx, trainer, train_out, evals: dict, wall_s: float, peak_rss_mb: float,
                     ranks: list[dict], clock, image_cache: dict | None = None) -> dict:
    """completion.json, written last by rank 0; `ranks`: every rank's own counters (gathered), which must
    match that rank's ledger. `phases_s` closes with the time it takes to write it (finalize)."""
    cfg = plan.cfg
    state = trainer.state
    out = {
        "status": "completed",
        "run_name": plan.run_name,
        "arm": cfg.arm.name,
        "kind": str(plan.kind),
        "optimizer_steps": state.global_step,
        "stopped_by": "budget" if ctx.stopped_by_budget else "max_steps",
        "nonfinite_steps": ctx.nonfinite_steps,  # skipped, not applied (train.max_nonfinite_steps)
        "identity": run.manifest["identity"],
        "parent": run.manifest.get("parent"),
        "init": run.manifest.get("init"),
        "eval_before": _eval_summary(evals.get("before")),
        "eval_after": _eval_summary(evals.get("after")),
        # train.eval_steps: the curve between them (each point's artifact has per-relation figures and predictions)
        "eval_points": [{k: e.get(k) for k in ("step", "completion_tokens", "accuracy", "policy_sha256", "artifact")}
                        for e in periodic_evals(run.path, cfg.data.eval_split)],
        "checkpoints": [p.name for p in complete_checkpoints(run.path)],
        "wall_time_s": round(wall_s, 3),
        "train_runtime_s": round(train_out.metrics.get("train_runtime", 0.0), 3),
        "eval_during_train_s": round(ctx.eval_s, 3),  # periodic evals of this process (in phases_s.train)
        "peak_rss_mb": round(peak_rss_mb, 1),
        "peak_cuda_mb": _peak_cuda_mb(),
        "image_cache": image_cache,
        "completed_at": now(),
    }
    out["world_size"] = len(ranks)
    out.update(kind_run(plan.kind).completion_fields(plan, run.path, ctx, trainer, ranks))  # the budget, checked per rank
    # harness.run.learning
    out.update(kind_run(plan.kind).learning_signal(plan, run.path, len(ranks), out["eval_before"]))
    publish_policy(plan, run, out)
    clock.lap("finalize")
    out["phases_s"] = clock.as_dict()
    out["start_phases_s"] = dict(clock.start)  # seconds from this process's start to each phase's end (this write's)
    point(f"{plan.kind}.completion")  # tests only (harness.faults)
    atomic_write_json(run.path / COMPLETION, out)
    if cfg.logger.wandb or cfg.logger.trackio:
        from harness.trackers import log_completion

        log_completion(out)  # eval/* and budget/* into the run's W&B / trackio run (finished when the run ends)
    if cfg.logger.tensorboard:
        from harness.trackers import log_tensorboard

        log_tensorboard(run.path, out)
    return out


def publish_policy(plan, run, out: dict) -> None:
    """The card proper into final_policy/ (from what completion.json will say), then the push when asked for:
    both before completion.json, so a failed push leaves the run unfinished and the same command retries it."""
    from harness.card import publish_card
    from harness.accounting.weights import weights_digest

    fp = run.path / "final_policy"
    point(f"{plan.kind}.model_card")  # tests only (harness.faults): the final eval done, the card still provisional
    publish_card(plan, run.path, run.manifest["identity"], out, weights_digest(fp))
    train = plan.cfg.train
    if train.push_to_hub:
        from harness.hub import push_final_policy

        out["pushed_to_hub"] = push_final_policy(fp, train.hub_model_id, run_name=plan.run_name)


def _peak_cuda_mb() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
