"""The run lifecycle after planning: parents first, then the run's recipe (harness.run.recipe.Run):

    prerequisites (the SFT warm start, then a planned teacher) -> claim the run dir -> the recipe (setup: data,
    policy, resume point, context, eval before, loggers, trainer; train; finalize) -> the summary

One code path for one process and for every rank of a multi-process launch: rank 0 claims the run dir
and tells the others what it found; all ranks train together; rank 0 finalizes. A completed run is left
untouched (running the same command again says so). A failure marks the manifest `failed` with the
error, and re-raises; nothing half-written looks complete (completion.json and the status `completed`
are written last).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import time
import traceback
from pathlib import Path

from harness import dist
from harness.config.fields import TEACHER, WARM_START
from harness.errors import ConfigError, HarnessError, Problem, RunDirLocked
from harness.halt import Halted, defer, interrupted, signal_name
from harness.plan import Plan
from harness.rundir import COMPLETION, MANIFEST, RunDir, claim, read_json

log = logging.getLogger("harness")


def run_with_prerequisites(plan: Plan) -> int:
    """Run the plan's prerequisites in order (unless this run is already complete), then the plan itself."""
    cfg = plan.cfg
    if plan.kind.warm_start(cfg) and plan.parent is None:
        raise ConfigError([Problem("arm.init", "sft", "this plan carries no SFT parent (it was built from a config "
                                   "without its command line)",
                                   "plan it with harness.cli.compose_plan(argv), or set arm.init=scratch")])
    if cfg.arm.teacher_arm() is not None and plan.teacher is None:
        raise ConfigError([Problem("arm.teacher", cfg.arm.teacher, "this plan carries no teacher plan "
                                   "(it was built from a config without its command line)",
                                   "plan it with harness.cli.compose_plan(argv), or set arm.teacher=run:<run_name>")])
    t0 = time.perf_counter()
    todo = _status(plan.run_dir) != "completed"
    if todo:
        from harness.run.stages.preflight import check_loadable

        check_loadable(plan)  # a checkpoint whose processor cannot be built: refused before any run dir is claimed
    ran_parent = todo and bool(plan.prerequisites)
    for pre in plan.prerequisites:
        if todo:
            code = run_prerequisite(pre.plan, pre.what)
            if code:  # interrupted by a signal: so is this run (the same command continues both)
                return code
        plan = AFTER[pre.role](plan, ran=todo)
    return claim_and_run(plan, parent_s=time.perf_counter() - t0 if ran_parent else 0.0)


def _after_warm_start(plan: Plan, ran: bool) -> Plan:
    """The warm start just ran (`ran`): RL starts only from one that writes the answer format (check_warm_start)."""
    if ran:
        check_warm_start(plan)
    return plan


def _after_teacher(plan: Plan, ran: bool) -> Plan:
    """The plan with its completed teacher's final policy in identity.teacher (with_teacher_identity)."""
    if ran or _status(plan.teacher.run_dir) == "completed":
        return with_teacher_identity(plan)
    return plan


def check_warm_start(plan: Plan) -> None:
    """Refuse to start RL from a warm start that does not write the answer format: the share of its final eval's
    greedy answers that parse (format_valid) must reach budget.sft_warm_start_min_format. Below it, nearly every
    completion is invalid, gets the same reward, and GRPO's group advantages are zero: the run would spend its
    budget learning nothing."""
    need = plan.cfg.budget.sft_warm_start_min_format
    if not need or not plan.cfg.train.eval_after:  # the plan warned: no eval, nothing to check
        return
    # rank 0 reads the warm start's eval (it wrote it); every rank gets its verdict and stops with it
    verdict = _warm_start_verdict(plan, need) if dist.is_main() else None
    if dist.is_multi():
        verdict = dist.broadcast(verdict)
    if verdict:
        from harness.errors import WarmStartError

        raise WarmStartError(verdict)


def _warm_start_verdict(plan: Plan, need: float) -> str | None:
    """check_warm_start's message, or None when the warm start writes the format often enough."""
    import json

    from harness.eval import artifact_path

    cfg, parent = plan.cfg, plan.parent
    split = cfg.data.eval_split
    src = artifact_path(parent.run_dir, split, "final")
    try:
        ev = json.loads(Path(src).read_text())
    except (OSError, ValueError):
        return (f"WarmStartError: the SFT warm start {parent.run_dir} has no final eval ({src}) to check "
                "its answer format against budget.sft_warm_start_min_format\n"
                "    fix: run it with train.eval_after=true, or set budget.sft_warm_start_min_format=0")
    got = ev.get("format_valid", 0.0)
    log.info("the SFT warm start writes a well-formed answer on %.0f%% of %d %s views (at least %.0f%% needed)",
             100 * got, ev.get("n", 0), split, 100 * need)
    if got >= need:
        return None
    b, pc = cfg.budget, parent.budget
    sized = (f"budget.sft_warm_start_epochs={b.sft_warm_start_epochs}" if b.sft_warm_start_epochs else
             f"budget.sft_warm_start_steps={b.sft_warm_start_steps}")
    passes = f" ({pc['epochs']} passes over {pc['train_rows']} training rows)" if pc.get("epochs") else ""
    return (
        f"WarmStartError: the SFT warm start ({parent.run_name}) writes a well-formed <answer>...</answer> on only "
        f"{100 * got:.0f}% of the {ev.get('n', 0)} {split} views it was evaluated on (at least "
        f"{100 * need:.0f}% needed: budget.sft_warm_start_min_format={need}). RL from it would score almost every "
        "completion as invalid, with the same reward in a group: no advantage, no update.\n"
        f"    the warm start: {sized}{passes}; its eval: {src}\n"
        "    fix: train the warm start longer (raise budget.sft_warm_start_steps, or set budget.sft_warm_start_epochs), "
        "check that the eval split asks what the training split teaches, or set budget.sft_warm_start_min_format=0 "
        "to start RL anyway")


def with_teacher_identity(plan: Plan) -> Plan:
    """The plan with its planned teacher's final policy in identity.teacher (digest, eval), read now that the
    teacher has run: what the manifest, every checkpoint and a resume check then compare. The teacher's plan
    identity must still be the one planned (its semantic hash): a run dir of another teacher is refused."""
    from harness.accounting.weights import final_policy_identity

    now = final_policy_identity(plan.teacher.run_dir)
    planned = plan.identity["teacher"]
    if now["weights_sha256"] is None or now["semantic_sha256"] != planned["semantic_sha256"]:
        raise RuntimeError(f"the teacher run {plan.teacher.run_dir} is not the completed run this plan planned "
                           f"(semantic {now['semantic_sha256']}, planned {planned['semantic_sha256']})")
    return dataclasses.replace(plan, identity={**plan.identity, "teacher": {**planned, **now}})


#: what the lifecycle does once a prerequisite (harness.plan.Prerequisite) of a plan has run (or was complete)
AFTER = {WARM_START: _after_warm_start, TEACHER: _after_teacher}


def run_prerequisite(parent: Plan, role: str = "the SFT warm start", poll_s: float = 2.0) -> int:
    """Run a plan this one needs first (`role`: the SFT warm start, the teacher) unless it is complete. Jobs of a
    parallel sweep (joblib) that share it wait for the one that holds its lock instead of failing; a killed
    holder releases the lock by itself. Returns 0, or the exit code of a run interrupted by a signal
    (harness.halt); a failed one raises."""
    if dist.is_multi():  # every rank takes part (rank 0 claims); a complete parent returns at once
        return _check(parent, run_with_prerequisites(parent), role)
    waiting = False
    while _status(parent.run_dir) != "completed":
        try:
            if not waiting:
                log.info("running %s first (%s)", role, parent.run_name)
            code = run_with_prerequisites(parent)
        except RunDirLocked:
            if not waiting:
                log.info("%s %s is running in another process; waiting for it", role, parent.run_name)
                waiting = True
            time.sleep(poll_s)
            continue
        if _check(parent, code, role):
            return code
    return 0


def _check(parent: Plan, code: int, role: str = "the SFT warm start") -> int:
    if interrupted(code):  # with a checkpoint, not failed
        return code
    if code:
        raise RuntimeError(f"{role} {parent.run_dir} failed (exit {code})")
    return 0


def claim_and_run(plan: Plan, parent_s: float = 0.0) -> int:
    """Claim (rank 0), run the stages (every rank), print the summary (rank 0). A refusal on rank 0 ends
    every rank with its exit code. `parent_s`: the seconds this process spent running the plan's parents."""
    _check_world(plan)
    if dist.is_multi():
        from harness.policy import device_of

        dist.init(device_of(plan), timeout_s=plan.cfg.placement.collective_timeout_s)
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
    failed = True  # until the stages return or stop as planned: the W&B run's exit code
    try:
        if outcome["status"] == "completed":
            if main:
                log.info("run %s is already complete; nothing to do.", plan.run_name)
                log.info("  %s", run.path)
                logged = Plan.from_json(run.manifest["plan"]).cfg.logger  # what the finished run was run with
                added = loggers_not_logged(plan.cfg.logger, logged)
                if added:  # logger.* is not the run's identity: this command found the finished run, not a new one
                    log.info("  %s: loggers are not part of a run's identity, so this finished run is not trained "
                             "again; send its record there with: python -m harness.export %s --to %s",
                             ", ".join(f"logger={a}" for a in added), run.path, added[0])
                _summary(plan, read_json(run.path / COMPLETION))
            return 0
        if not main:
            run = RunDir.follower(plan.run_dir, resumed=outcome["resumed"])
        _announce(plan, run)
        try:
            completion = run_recipe(plan, run, parent_s=parent_s)
            failed = False
        except Halted as halt:  # a planned stop: its checkpoint is published, the same command continues
            failed = False
            return _halted(plan, run, halt)
        except BaseException as exc:
            rank = {"rank": dist.rank()} if dist.is_multi() else {}
            try:
                run.set_status("failed", error={"type": type(exc).__name__, "message": str(exc)[:2000],
                                                "traceback": traceback.format_exc()[-4000:], **rank})
            except OSError as again:  # the disk that failed the run may refuse this write too: the first error wins
                log.warning("could not record the failure in %s: %s", run.manifest_path, again)
            lost = dist.peer_lost(exc)
            if lost:  # another rank died: say so in one message, not a transport's traceback
                raise peer_lost_error(plan, run, lost) from exc
            raise
        if main:
            _summary(plan, completion)
        return 0
    finally:
        from harness.trackers import finish

        finish(failed=failed)  # a W&B run ends with its run (completed, stopped or failed)
        if run is not None:
            run.release()


def peer_lost_error(plan: Plan, run: RunDir, detail: str) -> dist.PeerLostError:
    from harness.accounting.checkpoint import complete_checkpoints

    newest = complete_checkpoints(run.path)
    return dist.PeerLostError(detail, newest[-1].name if newest else None, plan.cfg.placement.collective_timeout_s)


def loggers_not_logged(wanted, logged) -> list[str]:
    """The loggers (tensorboard, wandb, trackio) this command asks for that the finished run did not log to."""
    return [name for name in ("tensorboard", "wandb", "trackio") if getattr(wanted, name) and not getattr(logged, name)]


def _halted(plan: Plan, run: RunDir, halt: Halted) -> int:
    """Mark the run interrupted / paused (not failed), say how to continue; a scheduler's own handler of the
    signal (submitit: requeue the job) is deferred to the entry point (harness.halt.hand_over), which calls it
    once a sweep job's record is written. The exit code: 128 + the signal, 0 for a pause."""
    run.set_status(halt.status, event=halt.record(), halt=halt.record())
    if dist.is_main():
        how = f"by {signal_name(halt.signum)}" if halt.signum else "at budget.stop_after_steps"
        rest = "" if halt.signum else " without budget.stop_after_steps"
        log.info("run %s %s %s after step %d (%s published); exit %d. Run the same command%s to continue.",
                 plan.run_name, halt.status, how, halt.step, halt.checkpoint, halt.exit_code, rest)
    defer(halt.then, halt.signum)
    return halt.exit_code


def run_recipe(plan: Plan, run: RunDir, parent_s: float = 0.0) -> dict | None:
    """The run's recipe (harness.run.recipe.Run): set up (data, policy, resume point, context, eval before, loggers,
    trainer), train, finalize; cleaned up whatever happens. completion.json's content on rank 0, with the seconds
    of each phase (`phases_s`: the next regression is visible in every run). Throughout, SIGUSR1 writes this rank's
    stacks to the run dir (harness.diagnostics)."""
    from harness.diagnostics import StackDumps
    from harness.run.recipe import Run  # torch-free at import: what trains is imported by setup

    with run_objects(), StackDumps(run.path, dist.rank(), plan.cfg.train.hang_timeout_s) as dumps:
        recipe = Run(plan, run, parent_s=parent_s, dumps=dumps)
        try:
            recipe.setup()
            recipe.train()
            return recipe.finalize()
        finally:
            recipe.cleanup()


@contextlib.contextmanager
def run_objects():
    """The cyclic garbage collector looks only at what the run allocates. Every object alive when the run's
    stages start (modules, classes, functions of torch, transformers and TRL: ~500k objects) is moved to the
    collector's permanent generation (gc.freeze) for the run, so each full collection made during it skips
    them: transformers' Trainer collects before every training loop (accelerate's free_memory, 0.29 s of a
    20-step tiny run on 2 cores), as do the evals. When the run ends, one collection frees the run's own
    cycles (a model, a trainer: before the next job of a sweep in the same process starts), then the frozen
    objects go back to the collector. Nothing computed changes: the collector only ever frees unreachable
    objects; what it skips during the run is what was alive before it. A process already frozen (an outer
    run, or its own gc.freeze before forking workers) is left as it is: nothing frozen by others is unfrozen."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()  # the run's objects only: the permanent generation is not scanned
        gc.unfreeze()


def _check_world(plan: Plan) -> None:
    p = plan.cfg.placement
    n = p.world_size
    if dist.is_multi() and dist.world_size() != n:
        field = "placement.num_processes" if p.num_machines == 1 else "placement.num_machines x placement.num_processes"
        raise ConfigError([Problem(
            field, n, f"the launcher started {dist.world_size()} processes (WORLD_SIZE)",
            f"launch with --num_processes {n}, or set placement.num_processes={dist.world_size() // p.num_machines} "
            "(the budget is split across exactly these ranks)")])


def _status(run_dir: str) -> str | None:
    try:
        return read_json(Path(run_dir) / MANIFEST).get("status")
    except (OSError, ValueError):
        return None


def _announce(plan: Plan, run: RunDir) -> None:
    state = f"existing, status {run.manifest['status']}" if run.resumed else "new"
    ranks = f"; {dist.world_size()} ranks" if dist.is_multi() else ""
    log.info("run dir: %s (%s%s)", run.path, state, ranks)
    cfg = plan.cfg
    log.info("plan: arm=%s model=%s data=%s seed=%s; budget %s", cfg.arm.name, cfg.model.name, cfg.data.name, cfg.seed,
             plan.kind.budget_line(plan.budget))
    t = plan.identity.get("teacher")
    if t:  # opd: what it distills from
        of_run = f"run {t['run_name']} ({t['arm']}" if t.get("run_name") else f"{t['path']} ("
        acc = f"eval accuracy {t['eval_accuracy']:.3f}, " if t.get("eval_accuracy") is not None else ""
        log.info("teacher: %s, %sweights sha256 %s...)", of_run, acc, (t.get("weights_sha256") or "?")[:12])


def _summary(plan: Plan, comp: dict) -> None:
    """The end-of-run table: arm, steps, budget use, accuracy before -> after per relation, run dir."""
    lines = [f"{'arm':<8} {'steps':>5}  {'budget':<28} {'stopped by':<11} run dir"]
    used = plan.kind.used(comp)
    stopped = comp.get("stopped_by") or "-"
    lines.append(f"{comp['arm']:<8} {comp['optimizer_steps']:>5}  {used:<28} {stopped:<11} {plan.run_dir}")
    before, after = comp.get("eval_before") or {}, comp.get("eval_after") or {}
    if after:
        lines.append(f"  eval ({after.get('split')}, greedy, n={after.get('n')}):   before -> after")
        for rel in ["overall", *after.get("per_relation", {})]:
            a = after if rel == "overall" else after["per_relation"][rel]
            b = before if rel == "overall" else (before.get("per_relation") or {}).get(rel, {})
            extra = f"   (abstains {a['abstention_rate']:.2f})" if rel in ("MISSING", "FULL") else ""
            bs = f"{b['accuracy']:.3f}" if b.get("accuracy") is not None else "  -  "
            lines.append(f"    {rel:<11} accuracy {bs} -> {a['accuracy']:.3f}{extra}")
    points = comp.get("eval_points") or []
    if points:  # train.eval_steps: accuracy at each kept checkpoint, by the sampled tokens before it
        lines.append(f"  eval curve (accuracy @ {plan.kind.curve_unit}): "
                     + ", ".join(f"{p['accuracy']:.3f} @ {plan.kind.curve_point(p)}" for p in points))
    phases = comp.get("phases_s")
    if phases:
        reused = " (reused)" if before.get("reused_from") else ""
        lines.append("  phases (s): " + ", ".join(
            f"{k.replace('_', ' ')} {v:.1f}{reused if k == 'eval_before' else ''}" for k, v in phases.items())
            + f"; total {sum(phases.values()):.1f}" + _first_step_text(comp.get("start_phases_s") or {}))
    for line in lines:
        log.info("%s", line)
    for line in _no_signal_lines(plan, before, after) + _learning_lines(comp.get("learning_signal") or {}):
        log.warning("%s", line)


def _first_step_text(marks: dict) -> str:
    """'; first step done at 1.6 s after the run's own start (75.1 s counting its parent)': the report's time to
    first step (harness.report.runs.own_first_step) and, when this process ran the parent first, the total."""
    first, parent = marks.get("first_step"), marks.get("parent") or 0.0
    if not isinstance(first, (int, float)):
        return ""
    own = f"; first step done at {max(0.0, first - parent):.1f} s after the run's own start"
    return own + (f" ({first:.1f} s counting its parent)" if parent else "")


def _learning_lines(signal: dict) -> list[str]:
    """completion.json's learning_signal (harness.run.learning), as the end-of-run summary says it."""
    out = []
    found = signal.get("no_update")
    if found:
        until = ("to the end of training" if found.get("recovered_at") is None
                 else f"until step {found['recovered_at']}")
        grad = found.get("grad_norm_max")
        grad = f"; grad_norm at most {grad:.3g} over those steps" if isinstance(grad, (int, float)) else ""
        out += [f"NO LEARNING SIGNAL from step {found['since_step']} {until} ({found['rounds']} rounds{grad}): "
                f"{found['text']}", f"  {found['fix']}"]
    ceiling = signal.get("eval_before_at_ceiling")
    if ceiling:
        out += [f"NOTHING LEFT TO LEARN: {ceiling['text']}.", f"  {ceiling['fix']}"]
    return out


def _no_signal_lines(plan: Plan, before: dict, after: dict) -> list[str]:
    """A policy that abstains on every view of its final eval (harness.eval.abstention): what that means, and the fix."""
    from harness.eval.abstention import abstains_everywhere, abstention_fix, abstention_text

    if not abstains_everywhere(after):
        return []
    init = " Its init (the eval before training) abstained on every view too." if abstains_everywhere(before) else ""
    return [f"NO SIGNAL: {abstention_text(after)}{init}", f"  {abstention_fix(plan.cfg, plan.kind.samples)}"]
