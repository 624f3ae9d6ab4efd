"""A multirun sweep's bookkeeping: each job's record, the sweep's summary, the exit code of the sweep command.

- A job (`run_sweep_job`, in whatever process the launcher runs it: this one, a joblib worker, a SLURM job) runs the
  harness, then writes <sweep dir>/jobs/<n>.json: its overrides, status (completed | paused | interrupted |
  failed), run dir, exit code, error; under SLURM also the job id, the attempt (restart count), nodes and log, and
  the records of its earlier attempts (`attempts`: a requeued job's interrupted attempt is not a failure). Only
  then does a scheduler's handler of the signal that stopped it run (harness.halt.hand_over: submitit requeues the
  job and exits the process).
- The launching process (`SweepCallback`, a Hydra callback of conf/config.yaml) reads every record at the end and
  writes <sweep dir>/sweep.json; failed and interrupted jobs set the command's exit code (`exit_code`).

Torch-free.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from hydra.experimental.callback import Callback

from harness import slurm
from harness.halt import hand_over, interrupted
from harness.rundir import MANIFEST, atomic_write_json, now, read_json

log = logging.getLogger("harness")

_FAILED_JOBS: list[int] = []  # filled by SweepCallback in the launching process
_INTERRUPTED_JOBS: list[tuple[int, int | None]] = []  # (job, its exit code): the same
_PLANNED: dict[tuple[str, ...], str] = {}  # the current job's overrides -> the run dir its plan named


def run_sweep_job(cfg, hc, run) -> float | None:
    """One job of a sweep: `run(cfg, choices, overrides)` -> exit code. A failure is recorded and the sweep goes on
    with the next job; a signal (harness.halt) ends the sweep after this job's checkpoint (the same sweep command
    continues it: complete runs are skipped). Returns the job's objective for a sweeper that optimizes."""
    overrides = list(hc.overrides.task)
    _PLANNED.clear()  # run_dir_of: only this job's own plan is remembered
    record = {"job": hc.job.num, "overrides": overrides, "status": "failed", "exit_code": None, "error": None}
    total = os.environ.get(SWEEP_SIZE_ENV)
    if slurm.task_rank() == 0:
        log.info("sweep: job %d%s (#%d): %s", hc.job.num + 1, f" of {total}" if total else "", hc.job.num,
                 " ".join(overrides))
    code, value = 0, None
    try:
        code = run(cfg, dict(hc.runtime.choices), overrides)
        record.update(status="completed" if code == 0 else "interrupted" if interrupted(code) else "failed",
                      exit_code=code)
        if code == 0 and cfg.objective and slurm.task_rank() == 0:
            value = record["objective"] = objective(cfg, overrides)
    except Exception as exc:  # noqa: BLE001  (one failing job must not end the sweep)
        import traceback

        record.update(error={"type": type(exc).__name__, "message": str(exc)[:2000],
                             "traceback": traceback.format_exc()[-4000:]})
        log.error("sweep job %s failed: %s: %s", hc.job.num, type(exc).__name__, exc)
    finally:
        if slurm.task_rank() == 0:  # a job over several nodes runs this on each: its first task keeps the record
            record_job(Path(hc.sweep.dir), record)
    hand_over()  # a scheduler's requeue (submitit), now that the record says `interrupted`: it may exit
    if record["status"] == "failed" and slurm.job_info() is not None:
        raise SystemExit(code or 1)  # one SLURM job per sweep job: sacct / squeue show it FAILED, not COMPLETED
    if interrupted(code):
        log.warning("sweep: job %s was interrupted by a signal; the sweep stops here (exit %d). The same sweep "
                    "command continues it.", hc.job.num, code)
        raise SystemExit(code)
    return value


def objective(cfg, overrides: list[str]) -> float | None:
    """The finished job's `objective` (a harness.report metric, e.g. eval/accuracy), or None (a pause, no eval).
    Logged only when a sweeper asked for it (hydra/sweeper=optuna reads it)."""
    from harness.report.runs import read_run

    try:
        value = read_run(Path(run_dir_of(overrides))).metrics.get(cfg.objective)
    except Exception as exc:  # noqa: BLE001  (a job without a readable run has no value: the sweeper fails the trial)
        log.warning("objective %s: not read (%s)", cfg.objective, exc)
        return None
    if value is not None:
        log.debug("objective %s = %.6g", cfg.objective, value)
    return value


def record_job(sweep_dir: Path, record: dict) -> None:
    """<sweep dir>/jobs/<num>.json: the job's overrides, status and run dir (the sweep folder lists its jobs); under
    SLURM its job id, attempt, nodes and log, after the records of the same job's earlier attempts."""
    try:
        record["run_dir"] = run_dir_of(record["overrides"])
    except Exception:  # noqa: BLE001  (a config that does not plan has no run dir)
        record["run_dir"] = None
    if record["status"] == "completed" and record["run_dir"]:  # exit 0 is also a pause (budget.stop_after_steps)
        try:
            if read_json(Path(record["run_dir"]) / MANIFEST).get("status") == "paused":
                record["status"] = "paused"
        except (OSError, ValueError):
            pass
    path = sweep_dir / "jobs" / f"{record['job']}.json"
    info = slurm.job_info()
    if info is not None:
        record["slurm"] = info
        record["attempts"] = earlier_attempts(path, info["job_id"])
    atomic_write_json(path, record)


def earlier_attempts(path: Path, job_id: str) -> list[dict]:
    """The records of the same SLURM job's earlier attempts (a requeue runs the job again under its id)."""
    try:
        before = read_json(path)
    except (OSError, ValueError):
        return []
    if (before.get("slurm") or {}).get("job_id") != job_id:
        return []  # another job's record (the same sweep command run again): not an attempt of this one
    keep = ("status", "exit_code", "error")
    return [*before.get("attempts", []), {**{k: before.get(k) for k in keep},
                                          "restart_count": before["slurm"].get("restart_count")}]


def remember_run_dir(overrides: list[str], run_dir: str) -> None:
    """The run dir the current sweep job's plan named (harness.cli.run_job): its record and objective read it
    instead of planning the job twice more (a plan composes the job and its SFT warm start: ~1 s each time)."""
    _PLANNED[tuple(overrides)] = run_dir


def run_dir_of(overrides: list[str]) -> str:
    key = tuple(overrides)
    if key not in _PLANNED:  # the job failed before its plan: planned here (a config that does not plan raises)
        from harness.plan import compose_plan

        _PLANNED[key] = compose_plan(overrides).run_dir
    return _PLANNED[key]


SWEEP_SIZE_ENV = "HARNESS_SWEEP_JOBS"  # the sweep's job count, for the jobs' "job N of M" line (any process)


def sweep_size(config) -> int | None:
    """The number of jobs of a basic sweeper's sweep (the product of its swept values: hydra.sweeper.params, then
    the command line's overrides, which win for the same key); None for another sweeper (optuna: its trials)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = config.hydra.sweeper
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    counts: dict[str, int] = {}
    try:
        for o in OverridesParser.create().parse_overrides(params + list(config.hydra.overrides.task)):
            counts[o.key_or_group] = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
    except Exception:  # noqa: BLE001  (a count for a display line: Hydra itself reports a bad override)
        return None
    return math.prod(counts.values())


class SweepCallback(Callback):
    """Hydra callback (conf/config.yaml hydra.callbacks): at the end of a multirun, in the launching process
    whatever the launcher (basic, joblib, submitit, harness.slurm_launcher), read <sweep dir>/jobs/*.json, write
    <sweep dir>/sweep.json (every job: overrides, status, run dir, SLURM job) and remember the failures for the
    exit code."""

    def on_multirun_start(self, config, **kwargs) -> None:
        total = sweep_size(config)
        if total is not None:
            os.environ[SWEEP_SIZE_ENV] = str(total)  # read by run_sweep_job in this process, joblib workers, SLURM jobs

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        remove_empty_job_dirs(sweep_dir)
        jobs = []
        for p in sorted((sweep_dir / "jobs").glob("*.json"), key=lambda q: int(q.stem) if q.stem.isdigit() else -1):
            try:
                jobs.append(json.loads(p.read_text()))
            except (OSError, ValueError) as exc:
                jobs.append({"job": p.stem, "status": "unreadable", "error": str(exc)})
        paused = [j.get("job") for j in jobs if j.get("status") == "paused"]  # budget.stop_after_steps: on purpose
        # a signal (SIGTERM, Ctrl-C): a resumable checkpoint, not a failure; the same command finishes the job
        interrupted_ = [j for j in jobs if j.get("status") == "interrupted"]
        failed = [j.get("job") for j in jobs if j.get("status") not in ("completed", "paused", "interrupted")]
        _FAILED_JOBS.extend(failed)
        _INTERRUPTED_JOBS.extend((j.get("job"), j.get("exit_code")) for j in interrupted_)
        completed = len(jobs) - len(failed) - len(paused) - len(interrupted_)
        atomic_write_json(sweep_dir / "sweep.json", {
            "finished_at": now(), "launcher": str(config.hydra.launcher.get("_target_", "")),
            "jobs": len(jobs), "completed": completed, "paused": paused,
            "interrupted": [j.get("job") for j in interrupted_], "failed": failed,
            "runs": [{k: j.get(k) for k in ("job", "status", "overrides", "run_dir", "exit_code", "slurm")
                      if k != "slurm" or j.get(k)} for j in jobs]})
        log.info("sweep: %d job(s), %d completed, %s%s%d failed; %s", len(jobs), completed,
                 f"{len(paused)} paused, " if paused else "",
                 f"{len(interrupted_)} interrupted, " if interrupted_ else "", len(failed), sweep_dir)


def remove_empty_job_dirs(sweep_dir: Path) -> None:
    """Hydra's launchers make <sweep dir>/<job number>/ for every job; the harness writes nothing there (run dirs
    come from the plan; each job's record is jobs/<n>.json): the empty ones go, so the sweep dir holds what it says."""
    for d in sweep_dir.iterdir() if sweep_dir.is_dir() else ():
        if d.is_dir() and d.name.isdigit():
            try:
                d.rmdir()  # only when empty: a launcher's own files (logs) stay
            except OSError:
                pass


def exit_code() -> int:
    """The sweep command's exit code once Hydra returned: 1 when a job failed, else the first interrupted job's
    (143 for SIGTERM), else 0; what went wrong is logged."""
    if _FAILED_JOBS:
        log.error("sweep finished with %d failed job(s): %s (see <sweep dir>/jobs/)", len(_FAILED_JOBS),
                  ", ".join(map(str, _FAILED_JOBS)))
        return 1
    if _INTERRUPTED_JOBS:
        log.warning("sweep: %d job(s) interrupted by a signal: %s; each stopped at a checkpoint: run the same "
                    "command to finish them", len(_INTERRUPTED_JOBS), ", ".join(str(j) for j, _ in _INTERRUPTED_JOBS))
        return _INTERRUPTED_JOBS[0][1] or 1
    return 0
