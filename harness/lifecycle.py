"""The run lifecycle after planning:

    claim (lock, manifest) -> prepare data -> build policy -> train -> finalize -> summary

A completed run is left untouched (running the same command again says so). A failure marks
the manifest `failed` with the error, and re-raises; nothing half-written looks complete
(completion.json and the status `completed` are written last).
"""

from __future__ import annotations

import logging
import traceback

from harness.plan import Plan
from harness.rundir import claim, read_json

log = logging.getLogger("harness")


def execute(plan: Plan) -> int:
    from harness import dist

    if dist.is_multi():
        return execute_rank(plan)
    with claim(plan) as run:
        if run.manifest["status"] == "completed":
            log.info("run %s is already complete; nothing to do.", plan.run_name)
            log.info("  %s", run.path)
            _summary(plan, read_json(run.path / "completion.json"))
            return 0
        log.info("run dir: %s (%s)", run.path, f"existing, status {run.manifest['status']}" if run.resumed else "new")
        log.info("plan: arm=%s model=%s data=%s seed=%s; budget %s", plan.config["arm"]["name"],
                 plan.config["model"]["name"], plan.config["data"]["name"], plan.config["seed"], _budget_line(plan))
        from harness.train import run_training

        try:
            completion = run_training(plan, run)
        except BaseException as exc:
            run.set_status("failed", error={"type": type(exc).__name__, "message": str(exc)[:2000],
                                            "traceback": traceback.format_exc()[-4000:]})
            raise
        _summary(plan, completion)
        return 0


def execute_rank(plan: Plan) -> int:
    """One rank of a multi-process launch: rank 0 claims the run dir and tells the others what it found;
    all ranks train together; rank 0 finalizes. A refusal on rank 0 ends every rank with its exit code."""
    from harness import dist
    from harness.errors import ConfigError, HarnessError, Problem
    from harness.policy import device_of
    from harness.rundir import RunDir

    if dist.world_size() != plan.config["placement"]["num_processes"]:
        raise ConfigError([Problem(
            "placement.num_processes", plan.config["placement"]["num_processes"],
            f"the launcher started {dist.world_size()} processes (WORLD_SIZE)",
            f"launch with --num_processes {plan.config['placement']['num_processes']}, or set "
            f"placement.num_processes={dist.world_size()} (the budget is split across exactly these ranks)")])
    dist.init(device_of(plan))
    main = dist.is_main()
    if not main:
        log.setLevel(logging.WARNING)  # one console: rank 0's
    run, err, outcome = None, None, None
    if main:
        try:
            run = claim(plan)
            outcome = {"status": run.manifest["status"], "resumed": run.resumed}
        except HarnessError as exc:
            err, outcome = exc, {"error": type(exc).__name__, "code": exc.exit_code}
    outcome = dist.broadcast(outcome)
    if "error" in outcome:
        if err is not None:
            raise err
        return outcome["code"]
    try:
        if outcome["status"] == "completed":
            if main:
                log.info("run %s is already complete; nothing to do.", plan.run_name)
                _summary(plan, read_json(run.path / "completion.json"))
            return 0
        if main:
            log.info("run dir: %s (%s; %d ranks)", run.path, f"existing, status {run.manifest['status']}"
                     if run.resumed else "new", dist.world_size())
            log.info("plan: arm=%s model=%s data=%s seed=%s; budget %s", plan.config["arm"]["name"],
                     plan.config["model"]["name"], plan.config["data"]["name"], plan.config["seed"], _budget_line(plan))
        else:
            run = RunDir.follower(plan.run_dir, resumed=outcome["resumed"])
        from harness.train import run_training

        try:
            completion = run_training(plan, run)
        except BaseException as exc:
            run.set_status("failed", error={"type": type(exc).__name__, "message": str(exc)[:2000],
                                            "traceback": traceback.format_exc()[-4000:], "rank": dist.rank()})
            raise
        if main:
            _summary(plan, completion)
        return 0
    finally:
        if run is not None:
            run.release()


def _budget_line(plan: Plan) -> str:
    b = plan.budget
    if b["kind"] == "completion_tokens":
        return f"{b['completion_token_ceiling']} sampled tokens, <= {b['max_steps']} steps"
    return f"{b['loss_token_ceiling']} loss tokens, <= {b['max_steps']} steps"


def _summary(plan: Plan, comp: dict) -> None:
    """The end-of-run table: arm, steps, budget use, accuracy before -> after per relation, run dir."""
    lines = [f"{'arm':<8} {'steps':>5}  {'budget':<28} {'stopped by':<11} run dir"]
    if "completion_token_ceiling" in comp:
        used = f"{comp['realized_completion_tokens']}/{comp['completion_token_ceiling']} tokens"
    else:
        used = f"{comp['realized_loss_tokens']}/{comp['loss_token_ceiling']} loss tok"
    stopped = comp.get("stopped_by") or "-"
    lines.append(f"{comp['arm']:<8} {comp['optimizer_steps']:>5}  {used:<28} {stopped:<11} {plan.run_dir}")
    before, after = comp.get("eval_before") or {}, comp.get("eval_after") or {}
    if after:
        lines.append(f"  eval ({after.get('split')}, greedy, n={after.get('n')}):   before -> after")
        rels = ["overall", *after.get("per_relation", {})]
        for rel in rels:
            a = after if rel == "overall" else after["per_relation"][rel]
            b = before if rel == "overall" else (before.get("per_relation") or {}).get(rel, {})
            extra = f"   (abstains {a['abstention_rate']:.2f})" if rel in ("MISSING", "FULL") else ""
            bs = f"{b['accuracy']:.3f}" if b.get("accuracy") is not None else "  -  "
            lines.append(f"    {rel:<11} accuracy {bs} -> {a['accuracy']:.3f}{extra}")
    for line in lines:
        log.info("%s", line)
