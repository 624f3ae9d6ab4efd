"""`run_mode=smoke`: the harness's self-test of resume.

    1. run the job in a child process under <output_root>/smoke (a fresh run dir each time); the
       child kills itself with SIGKILL in the middle of the step after checkpoint N, so completions
       were sampled after the checkpoint and must be rolled back;
    2. run the same command again in a new process: it resumes from checkpoint N (frontier
       rollback, resume audit) and finishes;
    3. check: the first child really died by the signal, the second exited 0, every resume audit
       passed, harness.verify finds nothing, and the accounting is continuous (every step's
       completions exactly once, one metrics row per step).

Exit 0 only then. Torch-free: the training happens in the children.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from harness.accounting.logs import read_rows
from harness.errors import HarnessError
from harness.faults import KILL_RUN_ENV, KILL_STEP_ENV

log = logging.getLogger("harness")


class SmokeFailed(HarnessError):
    exit_code = 7


def smoke(plan) -> int:
    c = plan.cfg
    smoke_root = Path(c.output_root) / "smoke"
    run_dir = smoke_root / "runs" / plan.run_name
    save_steps, max_steps = c.train.save_steps, c.budget.max_steps
    if save_steps + 1 > max_steps:
        raise SmokeFailed(f"run_mode=smoke needs a checkpoint before the last step: train.save_steps ({save_steps}) "
                          f"+ 1 > budget.max_steps ({max_steps}).\n    fix: use debug=tiny, or a smaller train.save_steps")
    kill_step = save_steps + 1  # mid-way between checkpoint `save_steps` and the next one
    if run_dir.exists():
        shutil.rmtree(run_dir)
    link_referenced_runs(plan, smoke_root)
    args = [a for a in plan.overrides
            if not a.startswith(("run_mode=", "output_root=", "resume=", "data.cache_dir=", "model.cache_dir="))]
    cmd = [sys.executable, "-m", "harness", *args, f"output_root={smoke_root}", "run_mode=normal", "resume=auto",
           # the caches are shared with normal runs (cache paths are not part of a run's identity)
           f"data.cache_dir={c.data.cache_dir}", f"model.cache_dir={c.model.cache_dir}"]
    log.info("smoke: run %s under %s; kill it after step %d (checkpoint %d is the newest), then resume",
             plan.run_name, smoke_root, kill_step, save_steps)

    env = {**os.environ, KILL_RUN_ENV: plan.run_name, KILL_STEP_ENV: str(kill_step)}
    first = subprocess.run(cmd, env=env)
    ranks = c.placement.world_size
    # One process dies by the signal itself; the ranks of a multi-process job die inside the launcher, whose
    # exit code is then non-zero (and no rank got to write completion.json).
    killed = first.returncode == -signal.SIGKILL if ranks == 1 else \
        (first.returncode != 0 and not (run_dir / "completion.json").exists())
    if not killed:
        raise SmokeFailed(f"smoke: the first process should have died by SIGKILL after step {kill_step}, "
                          f"it exited with {first.returncode}")
    log.info("smoke: first %s killed by SIGKILL as planned; relaunching the same command",
             "process" if ranks == 1 else f"launch ({ranks} ranks)")
    env = {k: v for k, v in os.environ.items() if k not in (KILL_RUN_ENV, KILL_STEP_ENV)}
    second = subprocess.run(cmd, env=env)
    if second.returncode != 0:
        raise SmokeFailed(f"smoke: the resumed process exited with {second.returncode}")

    problems = check_resumed_run(run_dir)
    if problems:
        raise SmokeFailed("smoke: the resumed run is not continuous:\n" + "\n".join(f"  - {p}" for p in problems))
    log.info("smoke: passed: resumed from checkpoint-%d, every audit passed, accounting continuous (%s)",
             save_steps, run_dir)
    return 0


def link_referenced_runs(plan, smoke_root: Path) -> None:
    """The runs the plan names by run:<name> (opd's arm.teacher, in identity.teacher) resolve under output_root/runs:
    the children's output_root is <output_root>/smoke, so each gets a link there to the same run."""
    for part in plan.identity.values():
        if not (isinstance(part, dict) and str(part.get("spec", "")).startswith("run:") and part.get("run_name")):
            continue
        target = Path(plan.cfg.output_root).resolve() / "runs" / part["run_name"]
        link = smoke_root / "runs" / part["run_name"]
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(target, target_is_directory=True)


def check_resumed_run(run_dir: Path) -> list[str]:
    from harness.verify import verify

    out = list(verify(run_dir))
    audits = sorted((run_dir / "audits").glob("resume-*-rank-*.json")) if (run_dir / "audits").is_dir() else []
    if not audits:
        out.append("no resume audit was written")
    for a in audits:
        report = json.loads(a.read_text())
        if report["status"] != "passed":
            out.append(f"{a.name}: {report['status']}")
    comp_path = run_dir / "completion.json"
    if not comp_path.is_file():
        return out + ["completion.json is missing"]
    comp = json.loads(comp_path.read_text())
    steps = comp["optimizer_steps"]
    metric_steps = [r["step"] for r in read_rows(run_dir / "metrics.jsonl")]
    if metric_steps != list(range(1, steps + 1)):
        out.append(f"metrics.jsonl steps are {metric_steps[:20]}..., expected 1..{steps} once each")
    ledger = run_dir / "ledgers" / "rank-0.jsonl"
    if ledger.exists():
        from harness.plan import Plan

        rnd = Plan.from_json(json.loads((run_dir / "run_manifest.json").read_text())["plan"]).round
        per_step = Counter(r["step"] for r in read_rows(ledger))
        # TRL samples at the global step it is about to take, once per generation round
        expected = {s for s in range(steps) if rnd.opens_round(s)}
        if set(per_step) != expected or len(set(per_step.values())) != 1:
            out.append(f"ledger rows per step are uneven or missing: {dict(sorted(per_step.items()))}")
    return out
