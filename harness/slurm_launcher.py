"""hydra/launcher=slurm (conf/hydra/launcher/slurm.yaml): hydra-submitit-launcher's SLURM launcher, made to hold
up on a real cluster (the class: hydra_plugins.harness_slurm.launcher.SlurmLauncher).

- Before anything is submitted, the request is checked against `sinfo` (nodes, CPUs and memory per node, GPUs of
  the partition), and an sbatch refusal becomes a ConfigError that names the field (exit 2), not a traceback.
- Jobs are waited for with harness.slurm.states (scontrol, then sacct when the cluster has accounting): a job
  that died without a result (killed, out of memory, node lost) ends as `failed` within a poll interval and a grace
  (POLL_S + GRACE_S: 5 + 15 s), where submitit's own wait needs sacct and, without it, waited for ever. A requeued job (submitit's SIGUSR2,
  a preemption, `scontrol requeue`) is PENDING again, and is waited for until its last attempt ends.
- Each job's record (<sweep dir>/jobs/<n>.json, written by the job: harness.sweep) gets the scheduler's side: the
  final state, exit code and restarts; a job that wrote no record of its last attempt is `failed`, with the log.

Submission itself is upstream's (hydra-submitit-launcher 1.2.0, pinned): `submit` repeats its launch() up to the
array submission, because upstream waits inside the same method (NOTE(hydra-submitit-launcher-1.2.0)). Hydra takes
launchers only from the hydra_plugins package: hydra_plugins/harness_slurm/launcher.py holds the class, this module
its work.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf

from harness import slurm
from harness.errors import ConfigError, Problem
from harness.rundir import atomic_write_json, read_json

log = logging.getLogger("harness")

#: the placement field behind each launcher value that conf/hydra/launcher/slurm.yaml derives from it
VIA = {"nodes": "placement.num_machines", "cpus_per_task": "hydra.launcher.cpus_per_task",
       "mem_gb": "hydra.launcher.mem_gb", "gpus_per_node": "hydra.launcher.gpus_per_node"}
POLL_S = float(os.environ.get("HARNESS_SLURM_POLL_S", "5"))  # how often the scheduler is asked (result files: 1 s)
# a finished job's result file may lag on a shared filesystem (submitit waits as long)
GRACE_S = float(os.environ.get("HARNESS_SLURM_GRACE_S", "15"))


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """hydra_plugins.harness_slurm.launcher.SlurmLauncher.launch: check, submit, wait, complete the records."""
    from harness.log import setup_logging

    setup_logging()  # the launching process runs no job: its console is this launcher's lines
    missing = [c for c in ("sbatch", "srun", "scontrol") if shutil.which(c) is None]
    if missing:  # submitit would raise a RuntimeError from deep inside the sweep
        refuse(ConfigError([Problem("hydra/launcher", "slurm", f"SLURM's {', '.join(missing)} not found on PATH: this "
                                    "machine is not a SLURM client", "run the sweep on a machine of the cluster (a "
                                    "login node), or use hydra/launcher=joblib on this one")]))
    problems = slurm.request_problems(launcher.params, slurm.partitions(), VIA)
    if problems:
        refuse(ConfigError(problems))
    jobs = submit(launcher, job_overrides, initial_job_idx)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    return wait(jobs, [list(o) for o in job_overrides], initial_job_idx, sweep_dir)


def submit(launcher, job_overrides, initial_job_idx: int) -> list:
    """Upstream's launch() up to `executor.map_array` (NOTE(hydra-submitit-launcher-1.2.0)): one array job, each
    task running `launcher(overrides, ...)`; an sbatch refusal is a ConfigError naming the field."""
    import submitit
    from submitit.core.utils import FailedJobError

    params = launcher.params
    init_params = {"folder": params["submitit_folder"], "slurm_max_num_timeout": params["max_num_timeout"]}
    executor = submitit.AutoExecutor(cluster="slurm", **init_params)
    baseparams = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in baseparams else f"slurm_{k}": v for k, v in params.items()
                                  if k not in ("submitit_folder", "max_num_timeout")})
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info("SLURM sweep of %d job(s): %s", len(job_overrides), sweep_dir)
    job_params = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
    try:
        return executor.map_array(launcher, *zip(*job_params))
    except FailedJobError as exc:
        refuse(ConfigError([slurm.sbatch_problem(str(exc), params)]))
    return []


def refuse(err: ConfigError) -> None:
    """Print the error and exit 2: Hydra would wrap an exception from a launcher in its own traceback."""
    import sys

    print(str(err), file=sys.stderr)
    raise SystemExit(err.exit_code)


def wait(jobs: list, overrides: list[list[str]], first_idx: int, sweep_dir: Path) -> list[JobReturn]:
    """Every job's JobReturn once it is over: its result, or (died without one) a record saying so."""
    watch = Watch(jobs, first_idx, sweep_dir)
    try:
        watch.until_over()
    except KeyboardInterrupt:
        log.warning("the sweep stopped waiting; its SLURM jobs go on without it (`scancel %s` stops them); each "
                    "records its run in %s/jobs/", " ".join(watch.ids[i] for i in sorted(watch.pending)), sweep_dir)
        raise
    return [collect(job, overrides[i], first_idx + i, sweep_dir, watch.last.get(watch.ids[i]))
            for i, job in enumerate(jobs)]


class Watch:
    """The sweep's jobs until each is over: SLURM says so (a final state) and its result file or its record of the
    last attempt is there, or GRACE_S after either without the other (a result file lagging on a shared
    filesystem; a job killed before it wrote anything). One console line per change of a job's state."""

    def __init__(self, jobs: list, first_idx: int, sweep_dir: Path):
        self.jobs, self.first_idx, self.sweep_dir = jobs, first_idx, sweep_dir
        self.ids = [j.job_id for j in jobs]
        self.pending = set(range(len(jobs)))
        self.last: dict = {}  # job id -> its newest JobState
        self.since: dict[int, float] = {}  # job -> when it first looked over
        self.told: dict[int, tuple] = {}  # job -> the state last printed
        for i, job in enumerate(jobs):
            log.info("job %d -> SLURM job %s (log: %s)", first_idx + i, job.job_id, job.paths.stderr)

    def until_over(self) -> None:
        last_poll = float("-inf")
        while self.pending:
            now = time.monotonic()
            if now - last_poll >= POLL_S:
                last_poll = now
                self.last.update(slurm.states([self.ids[i] for i in self.pending]))
                for i in sorted(self.pending):
                    self.tell(i)
            for i in sorted(self.pending):
                if self.over(i, now):
                    self.pending.discard(i)
            if self.pending:
                time.sleep(1.0)

    def over(self, i: int, now: float) -> bool:
        result, st = self.jobs[i].paths.result_pickle.exists(), self.last.get(self.ids[i])
        final = st is not None and st.final
        if not (result or final):
            self.since.pop(i, None)  # running, pending, requeued: wait on
            return False
        self.since.setdefault(i, now)
        wrote = final and (result or recorded(self.sweep_dir / "jobs" / f"{self.first_idx + i}.json", st))
        return wrote or now - self.since[i] >= GRACE_S

    def tell(self, i: int) -> None:
        """`job 0 (SLURM 12_0): RUNNING on n1`; `... PENDING (BeginTime), restart 1` after a requeue."""
        st = self.last.get(self.ids[i])
        if st is None:
            return
        now = (st.state, st.restarts, st.reason if st.state == "PENDING" else None)
        if now != self.told.get(i):
            where = f" ({st.reason})" if st.state == "PENDING" and st.reason not in (None, "None") else \
                f" on {st.nodes}" if st.state == "RUNNING" and st.nodes else ""
            again = f", restart {st.restarts}" if st.restarts else ""
            log.info("job %d (SLURM %s): %s%s%s", self.first_idx + i, self.ids[i], st.state, where, again)
            self.told[i] = now


def recorded(path: Path, state) -> bool:
    """Whether the job's last attempt wrote its record (a job that failed exits without a result file, after it)."""
    try:
        info = read_json(path).get("slurm") or {}
    except (OSError, ValueError):
        return False
    return state.restarts is None or info.get("restart_count") == state.restarts


def collect(job, overrides: list[str], num: int, sweep_dir: Path, state) -> JobReturn:
    """The job's JobReturn; its record gets the scheduler's view (a job that died without one gets a record)."""
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    error = None
    if job.paths.result_pickle.exists():
        try:
            ret = job.results()[0]
        except Exception as exc:  # noqa: BLE001  (the job's own code raised: its record says what)
            error = {"type": type(exc).__name__, "message": str(exc)[-2000:]}
    died = not job.paths.result_pickle.exists()
    update_record(sweep_dir / "jobs" / f"{num}.json", num, overrides, job, state, died=died, error=error)
    if ret.status is not JobStatus.COMPLETED:  # Hydra's sweeper would raise it and end the sweep: the record holds it
        ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    return ret


def update_record(path: Path, num: int, overrides: list[str], job, state, died: bool, error: dict | None) -> dict:
    """jobs/<num>.json with the scheduler's side (`slurm.state`, exit code, restarts). The job's own record of its
    last attempt stands (completed, paused, interrupted, failed with its error); a job that wrote none (killed,
    out of memory, a node lost), or whose record is an earlier attempt's, is `failed`: what SLURM says of it, and
    where its log is."""
    try:
        record, own = read_json(path), True
    except (OSError, ValueError):
        record, own = {"job": num, "overrides": overrides, "status": "failed", "exit_code": None, "error": None,
                       "run_dir": None}, False
    info = record.setdefault("slurm", {"job_id": job.job_id, "restart_count": None})
    info.setdefault("log", str(job.paths.stderr))
    if state is not None:
        info.update(state=state.state, slurm_exit_code=state.exit_code, reason=state.reason)
        if state.restarts is not None:
            # the record is an earlier attempt's: the last one (a requeue) died before it wrote its own
            own = own and not (info.get("restart_count") is not None and state.restarts > info["restart_count"])
            info["restart_count"] = state.restarts
    if error is not None or (died and not own):
        what = state.state if state is not None else "in an unknown state"
        record.update(status="failed", exit_code=None, error=error or {
            "type": "SlurmJobDied", "message": f"SLURM job {job.job_id} ended {what} (exit "
            f"{info.get('slurm_exit_code')}) without recording its result: see {info['log']}"})
        log.error("sweep job %d (SLURM job %s): %s", num, job.job_id, record["error"]["message"])
    atomic_write_json(path, record)
    return record
