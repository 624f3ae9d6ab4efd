"""The evals a run makes around training: before it (RL arms, fresh runs: the init policy), periodic ones
(train.eval_steps: the PeriodicEvalCallback's scorer) and the final eval's scorer (harness.run.stages.finalize);
and the reuse of an SFT warm start's final eval as the eval before when it scored the same weights with the
same settings. Torch-free at import (the model work is imported inside the functions)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from harness import dist

if TYPE_CHECKING:
    from harness.run.context import RunContext
    from harness.policy import Policy

log = logging.getLogger("harness")


def eval_policy(plan, run_dir: Path, data, policy: Policy, *, label: str, policy_ref: str, weights) -> dict:
    """Greedy eval of the live model on the plan's held-out split: eval/<split>[-label].json."""
    from harness.eval.greedy import write_eval
    from harness.accounting.weights import weights_digest

    res, preds = score_policy(plan, data, policy, label=label, policy_ref=policy_ref, policy_sha256=weights_digest(weights))
    write_eval(run_dir, res, preds)
    log.info("eval %s: accuracy %.3f on %d %s views", "after" if label == "final" else label, res["accuracy"],
             res["n"], plan.cfg.data.eval_split)
    return res


def score_policy(plan, data, policy: Policy, *, label: str, policy_ref: str,
                 policy_sha256: str | None) -> tuple[dict, list[dict]]:
    """(artifact, predictions) of the live model's greedy eval on the plan's held-out split; writes nothing."""
    from harness.eval.greedy import evaluate

    cfg = plan.cfg
    return evaluate(policy.model, policy.processor, data.root, data.test_rows, plan=plan, split=cfg.data.eval_split,
                    label=label, policy=policy_ref, rewards=plan_rewards(plan), is_vlm=cfg.model.is_vlm,
                    max_new_tokens=cfg.train.eval_max_new_tokens, batch_size=cfg.train.eval_batch_size,
                    suppress_token_ids=policy.suppress_token_ids, eos_token_ids=policy.eos_token_ids,
                    # what makes the artifact comparable with a later `python -m harness.eval` of the same weights
                    extra=eval_settings(plan, data, policy_sha256))


def plan_rewards(plan):
    """The plan's reward functions, loaded once per process (eval before, training, periodic and final eval)."""
    from harness.rewards.functions import Rewards
    from harness.rewards.identity import check_sources

    if _REWARDS[0] is not plan:  # one slot: a sweep's next job in this process replaces the previous one's
        # a reward file edited between the plan (whose run name carries its code digest) and now, e.g. while a
        # SLURM job waited in the queue, would train other code under this run's name: refused, naming the file
        reward = reward_json(plan)
        check_sources(reward, plan.identity.get("reward"), plan.run_dir)
        _REWARDS[:] = [plan, Rewards(reward, data_source=plan.cfg.data.name)]
    return _REWARDS[1]


_REWARDS: list = [None, None]  # [the plan, its loaded Rewards]


def reward_json(plan) -> dict:
    """The plan's reward config serialized, as the plan JSON has it (`to_jsonable` inverts the typed config): what
    the reward functions load from (as from a run manifest, harness.eval.cli) and what eval artifacts record."""
    from harness.identity import to_jsonable

    return to_jsonable(plan.cfg.reward)


def periodic_eval(plan, run_dir: Path, data, policy: Policy, ctx: RunContext, *, log, file_digest):
    """train.eval_steps: the PeriodicEvalCallback of this run. `log(logs)`: to the trainer's every sink;
    `file_digest(path)`: a checkpoint file's digest as publish records it."""
    from harness.eval.periodic import PeriodicEvalCallback
    from harness.eval.greedy import write_eval

    def evaluate(step: int):
        ref = f"checkpoint-{step}"  # the weights digest is added at save time (harness.run.callbacks)
        return score_policy(plan, data, policy, label=ref, policy_ref=ref, policy_sha256=None)

    return PeriodicEvalCallback(ctx, plan.cfg.train.eval_steps, evaluate=evaluate,
                                write=lambda result, preds: write_eval(run_dir, result, preds), log=log,
                                file_digest=file_digest)


def eval_settings(plan, data, policy_sha256: str | None) -> dict:
    """What an eval artifact records besides its metrics, so that a later eval of the same weights can
    recognize it (harness.eval.REUSE_KEYS; `python -m harness.eval` reads policy_sha256 and max_items)."""
    from harness.rewards.identity import source_digests

    reward = reward_json(plan)
    return {"policy_sha256": policy_sha256, "max_items": plan.cfg.data.eval_max_items,
            "data_sha256": data.content_sha256, "reward": dict(reward),
            # the reward files as they are now (an SFT warm start's eval too: its identity leaves the reward out)
            "reward_sources": source_digests(reward)}


def eval_before(plan, run_dir: Path, data, policy: Policy, *, resumed: bool) -> dict:
    """RL arms, fresh runs (not `resumed` from a checkpoint): the init policy on rank 0 (the other ranks hold the
    same weights; they wait). An SFT warm start's own final eval is reused when it evaluated these weights with
    these settings."""
    if not plan.kind.evaluates_init(plan.cfg) or resumed:
        return {}
    out = {}
    if dist.is_main():
        from harness.run.learning import at_ceiling

        out["before"] = (reuse_parent_eval(plan, run_dir, data, policy)
                         or eval_policy(plan, run_dir, data, policy, label="before", policy_ref=policy.init["path"],
                                        weights=policy.init["path"]))
        ceiling = at_ceiling(out["before"], plan.cfg.data.eval_split)
        if ceiling is not None:  # said before the first step: the researcher may stop here
            log.warning("NOTHING LEFT TO LEARN: %s.\n  %s", ceiling["text"], ceiling["fix"])
    dist.barrier()
    return out


def reuse_parent_eval(plan, run_dir: Path, data, policy: Policy) -> dict | None:
    """The parent's final eval as this run's eval before (written to eval/<split>-before.json with
    `reused_from`), when it scored the same weights (digest) with the same settings; else None."""
    import json

    from harness.eval import artifact_path, decoding, reuse_mismatches
    from harness.accounting.weights import weights_digest
    from harness.rundir import atomic_write_bytes, atomic_write_json, now

    if policy.init.get("kind") != "sft":
        return None
    t, split = plan.cfg.train, plan.cfg.data.eval_split
    src = artifact_path(policy.init["parent_run_dir"], split, "final")
    try:
        stored = json.loads(src.read_text())
    except (OSError, ValueError):
        return None
    wanted = {**eval_settings(plan, data, weights_digest(policy.init["path"])), "split": split,
              "decoding": decoding(t.eval_max_new_tokens, t.eval_batch_size),
              "code": plan.identity.get("code")}
    diffs = reuse_mismatches(stored, wanted)
    if diffs:
        log.info("eval before: the SFT warm start's eval differs in %s; evaluating", ", ".join(diffs))
        return None
    out = artifact_path(run_dir, split, "before")
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
             "sha256 %s..., reused)", res["accuracy"], res["n"], split, stored["policy_sha256"][:12])
    return res
