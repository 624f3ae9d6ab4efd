"""harness.slurm and harness.slurm_launcher's decisions without a cluster: reading scontrol / sacct / sinfo, the
request checked against the partitions, sbatch's refusals named by field, and what a job's record says once it is
over (the cluster runs in tests/integration/test_slurm.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import slurm
from harness.slurm_launcher import update_record


def test_scontrol_lines_give_each_job_and_each_task_of_a_pending_array():
    text = ("JobId=12 ArrayJobId=12 ArrayTaskId=2-3%2 JobName=harness JobState=PENDING Reason=Resources Restarts=0\n"
            "JobId=13 ArrayJobId=12 ArrayTaskId=1 JobName=harness JobState=RUNNING Reason=None Restarts=1 "
            "ExitCode=0:0\n"
            "JobId=14 JobName=x JobState=FAILED Reason=NonZeroExitCode Restarts=0 ExitCode=12:0\n")
    jobs = slurm.parse_scontrol_jobs(text)
    assert {k: v.state for k, v in jobs.items()} == {"12": "PENDING", "12_2": "PENDING", "12_3": "PENDING",
                                                   "13": "RUNNING", "12_1": "RUNNING", "14": "FAILED"}
    assert jobs["12_1"].restarts == 1 and jobs["14"].final and not jobs["12_1"].final
    assert jobs["14"].exit_code == "12:0"


def test_sacct_rows_and_a_pending_array_row():
    jobs = slurm.parse_sacct("7_[0-2%2]|PENDING|0:0\n8|CANCELLED by 0|0:15\n9_1|OUT_OF_MEMORY|0:125\n")
    assert {k: v.state for k, v in jobs.items()} == {"7_0": "PENDING", "7_1": "PENDING", "7_2": "PENDING",
                                                   "8": "CANCELLED", "9_1": "OUT_OF_MEMORY"}
    assert jobs["9_1"].final and not jobs["7_1"].final


def test_states_fall_back_to_sacct_then_to_gone(monkeypatch):
    """A job the controller forgot (MinJobAge) comes from sacct; without accounting it is GONE: over, so the sweep
    does not wait for it for ever (submitit's watcher reads only sacct, and without it waited for ever)."""
    calls = []

    def fake_run(*cmd, timeout=30):
        calls.append(cmd[:4] if cmd[0] == "scontrol" else cmd[0])
        if cmd[0] == "scontrol" and cmd[-1] == "5":
            return 0, "JobId=5 JobState=RUNNING Reason=None Restarts=0\n", ""
        if cmd[0] == "scontrol":
            return 1, "", "slurm_load_jobs error: Invalid job id specified"
        return 1, "", "sacct: error: Slurm accounting storage is disabled"

    monkeypatch.setattr(slurm, "_run", fake_run)
    got = slurm.states(["5", "6_0", "6_1"])
    assert got["5"].state == "RUNNING" and got["6_0"].state == slurm.GONE and got["6_1"].final
    assert calls == [("scontrol", "show", "job", "-o")] * 2 + ["sacct"]  # one call per array, not per task
    monkeypatch.setattr(slurm, "_run", lambda *c, timeout=30: (1, "", "slurm_load_jobs error: Unable to contact"))
    assert slurm.states(["5"]) == {}  # the controller does not answer: no verdict, ask again later


def test_nodelists_expand_as_scontrol_show_hostnames_does():
    assert slurm.expand_nodelist("n[1-3,5],gpu7,a[08-10]x") == ["n1", "n2", "n3", "n5", "gpu7", "a08x", "a09x", "a10x"]
    assert slurm.expand_nodelist("localhost") == ["localhost"]


def test_the_job_record_names_the_job_and_its_attempt():
    env = {"SLURM_JOB_ID": "13", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "1", "SLURM_RESTART_COUNT": "2",
           "SLURM_JOB_NODELIST": "n[1-2]", "SUBMITIT_FOLDER": "/o/slurm/%j", "SUBMITIT_EXECUTOR": "slurm"}
    assert slurm.job_info(env) == {"job_id": "12_1", "restart_count": 2, "nodes": "n[1-2]", "partition": None,
                                   "log": "/o/slurm/12_1/12_1_0_log.err"}
    assert slurm.job_info({}) is None and slurm.task_rank({"SLURM_PROCID": "1"}) == 1
    # a sweep run inside an allocation (srun python -m harness -m ...) is not a SLURM job per sweep job: its jobs
    # share the process, and a failed one must not exit it
    assert slurm.job_info({k: v for k, v in env.items() if k != "SUBMITIT_EXECUTOR"}) is None


PARTS = {"debug": slurm.Partition("debug", 2, 4, 8192, [], True), "gpu": slurm.Partition("gpu", 1, 32, 256000,
                                                                                         ["gpu:h100:8"])}


@pytest.mark.parametrize("params, field", [
    ({"nodes": 3, "cpus_per_task": 1}, "placement.num_machines"),
    ({"cpus_per_task": 16}, "hydra.launcher.cpus_per_task"),
    ({"mem_gb": 64}, "hydra.launcher.mem_gb"),
    ({"gpus_per_node": 1}, "hydra.launcher.gpus_per_node"),
    ({"partition": "nope"}, "hydra.launcher.partition"),
])
def test_a_request_no_node_can_meet_is_refused_naming_the_field(params, field):
    from harness.slurm_launcher import VIA

    (problem,) = slurm.request_problems(params, PARTS, VIA)
    assert problem.field == field and problem.fix, problem


def test_a_request_that_fits_passes_and_no_sinfo_checks_nothing():
    from harness.slurm_launcher import VIA

    assert slurm.request_problems({"partition": "gpu", "nodes": 1, "cpus_per_task": 32, "mem_gb": 200,
                                   "gpus_per_node": 8}, PARTS, VIA) == []
    assert slurm.request_problems({"cpus_per_task": 999}, None, VIA) == []


@pytest.mark.parametrize("message, field", [
    ("sbatch: error: Invalid generic resource (gres) specification", "hydra.launcher.gpus_per_node"),
    ("sbatch: error: Memory specification can not be satisfied", "hydra.launcher.mem_gb"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "hydra.launcher.cpus_per_task"),
    ("sbatch: error: invalid partition specified: gpu", "hydra.launcher.partition"),
    ("sbatch: error: something new", "hydra.launcher"),
])
def test_sbatch_refusals_name_the_field(message, field):
    problem = slurm.sbatch_problem(message, {"gpus_per_node": 2, "mem_gb": 64, "cpus_per_task": 16, "partition": "gpu"})
    assert problem.field == field and message.split("error: ")[1] in problem.why


@pytest.fixture
def record(tmp_path):
    """record(written, state, died, error) -> the record update_record leaves; `written`: what the job wrote."""
    job = SimpleNamespace(job_id="7", paths=SimpleNamespace(stderr=tmp_path / "7_0_log.err"))

    def _record(written: dict | None, state, died: bool = True, error: dict | None = None) -> dict:
        path = tmp_path / "jobs" / "0.json"
        path.parent.mkdir(exist_ok=True)
        path.unlink(missing_ok=True)
        if written is not None:
            path.write_text(json.dumps(written))
        update_record(path, 0, ["seed=0"], job, state, died=died, error=error)
        return json.loads(path.read_text())

    return _record


def job_wrote(status: str, code, restart_count: int = 0) -> dict:
    return {"job": 0, "overrides": ["seed=0"], "status": status, "exit_code": code, "error": None, "run_dir": "/r",
            "slurm": {"job_id": "7", "restart_count": restart_count, "log": "/o/7_0_log.err"}}


def test_a_job_killed_before_it_wrote_its_record_is_failed_with_slurms_state_and_its_log(record):
    r = record(None, slurm.JobState("7", "OUT_OF_MEMORY", "0:125", 0, "OutOfMemory"))
    assert r["status"] == "failed" and r["error"]["type"] == "SlurmJobDied"
    assert "ended OUT_OF_MEMORY" in r["error"]["message"] and r["slurm"]["log"] in r["error"]["message"]


def test_the_jobs_own_record_of_its_last_attempt_stands(record):
    completed = record(job_wrote("completed", 0, 1), slurm.JobState("7", "COMPLETED", "0:0", 1), died=False)
    assert completed["status"] == "completed" and completed["slurm"]["state"] == "COMPLETED"
    failed = record(job_wrote("failed", 12), slurm.JobState("7", "FAILED", "12:0", 0))  # it exits non-zero: no result
    assert failed["status"] == "failed" and failed["exit_code"] == 12 and failed["error"] is None
    stopped = record(job_wrote("interrupted", 143), slurm.JobState("7", "CANCELLED", "0:15", 0))  # scancel
    assert stopped["status"] == "interrupted"


def test_a_requeued_attempt_that_died_before_its_record_is_failed_not_interrupted(record):
    r = record(job_wrote("interrupted", 140, 0), slurm.JobState("7", "NODE_FAIL", "0:0", 1))
    assert r["status"] == "failed" and r["slurm"]["restart_count"] == 1 and "NODE_FAIL" in r["error"]["message"]


def test_an_error_the_job_raised_inside_submitit_is_the_records_error(record):
    r = record(job_wrote("completed", 0), slurm.JobState("7", "COMPLETED", "0:0", 0), died=False,
               error={"type": "FailedJobError", "message": "task 1 raised"})
    assert r["status"] == "failed" and r["error"]["type"] == "FailedJobError"


def test_the_resolvers_size_a_node_from_its_ranks():
    assert slurm.cpus_per_task("cuda", 4, None) == 32 and slurm.cpus_per_task("cpu", 4, None) == 4
    assert slurm.cpus_per_task("auto", 2, 6) == 12 and slurm.mem_gb("cpu", 2, "None") == 8
    assert slurm.gpus_per_node("auto", 4) == 4 and slurm.gpus_per_node("cpu", 4) is None
    assert Path(slurm.python_bin()).is_dir()
