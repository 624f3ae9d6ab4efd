"""Sweeps on a real SLURM cluster (scripts/slurm_local.sh: slurmctld and two slurmd, n1 and n2, on localhost; no
accounting, so no sacct), through `hydra/launcher=slurm_cpu` exactly as docs/scale-out.md runs them:

- a sweep of two jobs completes, each job's record naming its SLURM job;
- submitit's SIGUSR2, a preemption by a job of the higher-priority partition and `scontrol requeue` (SIGTERM)
  each stop a grpo job after its step with a checkpoint; the job is requeued (same job id, SLURM_RESTART_COUNT=1), resumes, passes the resume
  audit, and ends bit for bit equal to this session's uninterrupted run (tests/conftest.py TinyRuns);
- one run over two nodes (placement.num_machines=2, one rank per node) trains what one node with two ranks trains,
  bit for bit, straight or stopped by SIGUSR2 and requeued; a rank killed on one node ends both sides at once with
  exit 12, and `scontrol requeue` resumes the job to the same result;
- a job that dies without a result ends its sweep as failed (it waited for ever when the state came from sacct).

A requeued job is not eligible for ~120 s (SLURM's BeginTime): the tests start it 3 s after the requeue with
`scontrol update StartTime=now`, as an admin would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import PINNED, REPO, logged_values, run_dir_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
LAUNCHER = ("-m", "hydra/launcher=slurm_cpu", "placement.device=cpu")
TWO_NODES = ("placement=ddp", "placement.num_processes=1", "placement.num_machines=2", "placement.collective_timeout_s=60")


class Sweep:
    """`python -m harness -m hydra/launcher=slurm_cpu ARGS` in the background (threads pinned for bitwise
    comparisons: sbatch passes the environment on to the job). `hold_at`: grpo's step at whose end every rank
    waits (harness.faults' hold) until a stop signal reaches it or `release()`: the test's signal lands at that
    step however slow the machine or the scheduler; a requeued attempt, started after `release()`, does not wait."""

    def __init__(self, cluster, out: Path, *args: str, hold_at: int | None = None):
        self.cluster, self.out = cluster, out
        self.hold_file = out / "release-hold"
        env = {**os.environ, **PINNED, "HARNESS_SLURM_POLL_S": "2", "HARNESS_SLURM_GRACE_S": "5",
               "HARNESS_HOLD_FILE": str(self.hold_file)}  # a local disk: no result file lags
        if hold_at is not None:
            env["HARNESS_FAULT"] = f"rl.step@{hold_at}:hold"
        env.pop("HYDRA_FULL_ERROR", None)
        out.mkdir(parents=True, exist_ok=True)
        self.log = (out / "sweep.log").open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "harness", *LAUNCHER, f"output_root={out}", *args],
                                     cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def job_id(self, timeout: float = 120) -> str:
        """The SLURM job of the sweep's one job, once submitted."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for d in (self.out / "slurm").glob("*"):
                if re.fullmatch(r"\d+(_\d+)?", d.name) and any(d.glob("*_submitted.pkl")):
                    return d.name
            self.alive()
            time.sleep(0.5)
        raise AssertionError(f"no job submitted in {timeout} s: {self.text()[-3000:]}")

    def wait_for(self, what, label: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            self.alive()
            assert time.monotonic() < deadline, f"{label}: not within {timeout} s\n{self.text()[-3000:]}"
            time.sleep(0.2)

    def held(self, ranks: int = 1) -> bool:
        """Whether every rank waits in its hold now."""
        return len(list(self.out.glob(self.hold_file.name + ".held-*"))) == ranks

    def release(self) -> None:
        self.hold_file.write_text("")

    def start_requeued(self, job: str, state: dict) -> None:
        """A requeued job (PENDING for its BeginTime) started after 3 s instead of SLURM's ~120 s, the hold released
        first. Not at once: slurmd revokes the old attempt's credential with a time in seconds, and a new attempt
        allocated within that second was refused ("Job credential revoked") and FAILED (seen here)."""
        if state.get("JobState") != "PENDING" or state.get("Reason") != "BeginTime":
            self._requeued_at = None
            return
        self._requeued_at = getattr(self, "_requeued_at", None) or time.monotonic()
        if time.monotonic() - self._requeued_at >= 3:
            self.release()
            self.cluster.run("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)

    def finish(self, job: str | None = None, timeout: float = 600) -> int:
        """Wait for the sweep; a requeued job is started soon (start_requeued)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if job is not None:
                self.start_requeued(job, self.cluster.job(job))
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"the sweep did not end within {timeout} s:\n{self.text()[-3000:]}")
            time.sleep(0.5)
        return self.proc.returncode

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the sweep exited {self.proc.returncode}:\n{self.text()[-3000:]}"

    def text(self) -> str:
        self.log.flush()
        return (self.out / "sweep.log").read_text()

    def record(self, num: int = 0) -> dict:
        (sweep,) = (self.out / "sweeps").iterdir()
        return json.loads((sweep / "jobs" / f"{num}.json").read_text())

    def summary(self) -> dict:
        (sweep,) = (self.out / "sweeps").iterdir()
        return json.loads((sweep / "sweep.json").read_text())


def pids_of(job: str, rank: int | None = None) -> list[int]:
    """The processes of SLURM job `job` (by their environment), the training rank `rank` only when given."""
    out = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = dict(kv.split("=", 1) for kv in env_file.read_bytes().decode(errors="replace").split("\0") if "=" in kv)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job.split("_")[0] and (rank is None or (
                env.get("RANK") == str(rank) and "HARNESS_PLAN" in env)):
            out.append(int(env_file.parent.name))
    return out


@pytest.fixture(autouse=True)
def _no_jobs_left(slurm_cluster):
    yield
    slurm_cluster.cancel_all()


def test_a_sweep_of_two_jobs_completes_with_each_slurm_job_recorded(slurm_cluster, tmp_path):
    sweep = Sweep(slurm_cluster, tmp_path / "out", "arm=sft", "debug=tiny", "budget.max_steps=2",
                  "train.eval_after=false", "seed=0,1")
    assert sweep.finish() == 0, sweep.text()[-3000:]
    summary = sweep.summary()
    assert summary["completed"] == 2 and summary["failed"] == [], summary
    assert summary["launcher"] == "hydra_plugins.harness_slurm.launcher.SlurmLauncher"
    ids = set()
    for run in summary["runs"]:
        info = run["slurm"]
        assert info["state"] == "COMPLETED" and info["restart_count"] == 0 and Path(info["log"]).is_file(), info
        ids.add(info["job_id"])
        comp = json.loads((Path(run["run_dir"]) / "completion.json").read_text())
        assert comp["optimizer_steps"] == 2
    assert len(ids) == 2 and all(re.fullmatch(r"\d+_[01]", i) for i in ids), ids  # one array, a task per job


@pytest.mark.parametrize("how, sig", [("scancel --signal=USR2", "SIGUSR2"), ("preemption", "SIGUSR2"),
                                      ("scontrol requeue", "SIGTERM")])
def test_a_stopped_job_is_requeued_resumes_and_ends_bit_for_bit(slurm_cluster, tiny, tmp_path, how, sig):
    """submitit's requeue signal (SIGUSR2: the time-limit warning, or at once on a preemption with
    preempt_send_user_signal), or the SIGTERM of `scontrol requeue`, after step 2: the step finishes, checkpoint-3
    is published, the job is requeued under its id (by submitit for SIGUSR2, by SLURM itself for the requeue) and
    resumes from it. On main before this change SIGUSR2 ended the job with exit 140, FAILED, never requeued."""
    out = tiny.case(tmp_path / "out")  # the warm start copied: the job trains grpo only
    sweep = Sweep(slurm_cluster, out, *tiny.ARGS, *tiny.cache, hold_at=2)
    job = sweep.job_id()
    sweep.wait_for(sweep.held, "the hold at grpo's step 2")  # at its end, until the signal comes
    if how == "preemption":  # a job of partition `high` needs the node's only CPU: SLURM preempts ours (REQUEUE)
        node = slurm_cluster.job(job)["NodeList"]
        preemptor = slurm_cluster.run("sbatch", "--parsable", "-p", "high", "-w", node, "-n1", "-o",
                                      str(tmp_path / "preemptor.log"), "--wrap", "sleep 3").strip()
    elif how == "scontrol requeue":
        slurm_cluster.run("scontrol", "requeue", job)
    else:
        slurm_cluster.run("scancel", "--signal=USR2", job)
    assert sweep.finish(job) == 0, sweep.text()[-3000:]
    record = sweep.record()
    assert record["status"] == "completed" and record["slurm"]["job_id"] == job, record
    assert record["slurm"]["restart_count"] == 1 and record["slurm"]["state"] == "COMPLETED", record["slurm"]
    code = 140 if sig == "SIGUSR2" else 143
    assert [(a["status"], a["exit_code"]) for a in record["attempts"]] == [("interrupted", code)], record["attempts"]
    run = run_dir_of(out, "grpo")
    events = json.loads((run / "run_manifest.json").read_text())["events"]
    assert [(e.get("signal"), e.get("step")) for e in events if e["status"] == "interrupted"] == [(sig, 3)]
    assert json.loads((run / "audits" / "resume-1-rank-0.json").read_text())["status"] == "passed"
    tiny.assert_same(out)  # weights, logged values, ledger and trace of the run that never stopped
    if how == "preemption":
        assert slurm_cluster.job(preemptor).get("JobState") == "COMPLETED"


@pytest.fixture(scope="module")
def two_ranks_on_one_node(tiny, tmp_path_factory):
    """The reference of the two-node runs: the same grpo run as one machine with two ranks (the driver form, no
    SLURM)."""
    out = tiny.case(tmp_path_factory.mktemp("one-node"))
    proc = tiny.run(out, "placement=ddp", "placement.num_processes=2", "placement.device=cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir_of(out, "grpo")


def assert_same_two_rank_run(run: Path, ref: Path) -> None:
    comp = json.loads((run / "completion.json").read_text())
    assert comp["world_size"] == 2 and comp["status"] == "completed"
    assert verify(run) == [], verify(run)  # every rank's ledger against completion.json, equal replicas
    assert (run / "final_policy/model.safetensors").read_bytes() == (ref / "final_policy/model.safetensors").read_bytes()
    assert logged_values(run) == logged_values(ref)
    for rank in (0, 1):
        for log in ("ledgers", "traces"):
            rows = lambda d: [(r["completion_id"], r.get("tokens"), r.get("reward"))  # noqa: E731
                              for r in read_rows(d / log / f"rank-{rank}.jsonl")]
            assert rows(run) == rows(ref), f"{log}/rank-{rank}.jsonl differs"


@pytest.mark.multiprocess
@pytest.mark.parametrize("stopped", [False, True], ids=["straight", "sigusr2"])
def test_two_nodes_train_what_one_node_with_two_ranks_trains(slurm_cluster, tiny, two_ranks_on_one_node, tmp_path,
                                                             stopped):
    """One driver per node starts that node's rank; they meet at n1. Stopped by submitit's SIGUSR2 (SLURM signals
    every process of the job: each driver passes it to its rank, torchrun's agent ignores it), both ranks publish
    one checkpoint, the job is requeued and resumes on both nodes: still the run one node with two ranks trains."""
    out = tiny.case(tmp_path / "out")
    sweep = Sweep(slurm_cluster, out, *tiny.ARGS, *tiny.cache, *TWO_NODES, hold_at=2 if stopped else None)
    job = sweep.job_id()
    if stopped:
        sweep.wait_for(lambda: sweep.held(ranks=2), "both ranks' hold at grpo's step 2")
        slurm_cluster.run("scancel", "--signal=USR2", job)
    assert sweep.finish(job) == 0, sweep.text()[-3000:]
    record = sweep.record()
    assert record["status"] == "completed" and record["slurm"]["nodes"] == "n[1-2]", record
    assert record["slurm"]["restart_count"] == int(stopped), record["slurm"]
    assert [a["status"] for a in record["attempts"]] == ["interrupted"] * stopped
    run = run_dir_of(out, "grpo")
    assert len(list((run / "audits").glob("resume-1-rank-*.json"))) == 2 * stopped  # each rank audited its resume
    assert_same_two_rank_run(run, two_ranks_on_one_node)
    logs = [(out / "slurm" / job / f"{job}_{t}_log.err").read_text() for t in (0, 1)]
    for t, text in enumerate(logs):  # one driver per node, each starting its node's rank
        assert f"on machine {t} of 2 (SLURM job {job}" in text, text[-2000:]


@pytest.mark.multiprocess
def test_a_rank_killed_on_one_node_ends_the_job_and_a_requeue_resumes_it(slurm_cluster, tiny, two_ranks_on_one_node,
                                                                          tmp_path):
    out = tiny.case(tmp_path / "out")
    sweep = Sweep(slurm_cluster, out, *tiny.ARGS, *tiny.cache, *TWO_NODES, hold_at=3)
    job = sweep.job_id()
    sweep.wait_for(lambda: sweep.held(ranks=2), "both ranks' hold at grpo's step 3")
    (victim,) = pids_of(job, rank=1)
    os.kill(victim, signal.SIGKILL)  # the rank on n2
    sweep.release()  # n1's rank goes on, into the next step's collective, where n2's rank never comes
    assert sweep.finish(timeout=300) == 1, sweep.text()[-3000:]  # both sides ended; the job failed
    record = sweep.record()
    assert record["status"] == "failed" and record["exit_code"] == 12, record  # PeerLostError on the survivor
    assert record["slurm"]["state"] == "FAILED", record["slurm"]
    log0 = Path(record["slurm"]["log"]).read_text()
    assert "PeerLostError: rank 0 of 2: another rank of this job stopped answering" in log0, log0[-3000:]
    assert "fix: run the same command again to resume" in log0
    slurm_cluster.run("scontrol", "requeue", job)
    deadline = time.monotonic() + 300
    while (state := slurm_cluster.job(job)).get("JobState") != "COMPLETED":
        assert state.get("JobState") not in ("FAILED", "CANCELLED") or state.get("Restarts") == "0", state
        sweep.start_requeued(job, state)
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
    record = sweep.record()  # the requeued attempt's, written by the job itself
    assert record["status"] == "completed" and record["slurm"]["restart_count"] == 1
    assert [a["status"] for a in record["attempts"]] == ["failed"]
    run = run_dir_of(out, "grpo")
    assert all(json.loads(p.read_text())["status"] == "passed" for p in (run / "audits").glob("resume-1-rank-*.json"))
    assert len(list((run / "audits").glob("resume-1-rank-*.json"))) == 2
    assert_same_two_rank_run(run, two_ranks_on_one_node)


def test_a_job_that_dies_without_a_result_ends_its_sweep_as_failed(slurm_cluster, tmp_path):
    """Killed (as the out-of-memory killer would) before it wrote anything: the sweep ends and records the job
    failed with SLURM's state and its log; without accounting, submitit's own wait (sacct) would never end."""
    sweep = Sweep(slurm_cluster, tmp_path / "out", "arm=sft", "debug=tiny")
    job = sweep.job_id()
    sweep.wait_for(lambda: pids_of(job), "the job's processes")
    time.sleep(1)
    for pid in pids_of(job):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert sweep.finish(timeout=300) == 1, sweep.text()[-3000:]
    record = sweep.record()
    assert record["status"] == "failed" and record["error"]["type"] == "SlurmJobDied", record
    assert record["slurm"]["state"] in ("FAILED", "CANCELLED", "NODE_FAIL"), record["slurm"]
    assert record["slurm"]["log"] in record["error"]["message"]
    assert "sweep finished with 1 failed job(s)" in sweep.text()


def test_a_request_the_cluster_cannot_meet_is_refused_before_anything_is_submitted(slurm_cluster, tmp_path):
    """hydra/launcher=slurm on this CPU cluster asks for a GPU per rank (and 8 CPUs, 32 GB: more than a node here
    has on a small machine): exit 2, one problem per field with its fix (checked against sinfo), not a submitit
    traceback, and no job."""
    from tests.conftest import run_harness

    before = slurm_cluster.run("squeue", "-h", "-o", "%i")
    proc = run_harness("-m", "hydra/launcher=slurm", "arm=sft", "debug=tiny", f"output_root={tmp_path}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "hydra.launcher.gpus_per_node = 1: partition debug offers no GPUs" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "fix: set placement.device=cpu" in proc.stderr
    assert slurm_cluster.run("squeue", "-h", "-o", "%i") == before and not (tmp_path / "slurm").exists()
