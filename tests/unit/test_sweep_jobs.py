"""What a multirun sweep records of each job (<sweep dir>/jobs/<num>.json, read by the sweep summary): a job ended
by SIGTERM is `interrupted` with exit 143 (its run resumable, and the sweep stops there), a pause is `paused`, an
exception is `failed` with the error (and the sweep goes on). The job goes through harness.cli's sweep entry
(harness.sweep.run_sweep_job) and the
real lifecycle (plan, claim, the manifest's status); only the run's stages are replaced by how the job ends."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra.types import RunMode

from harness import cli, sweep
from harness.run import lifecycle
from harness.halt import Halted


@pytest.fixture
def job(compose_cfg, tmp_path, monkeypatch):
    """job(ends) -> (what the sweep entry returned or raised, the job's record, the run's manifest); `ends()` is run
    in place of the job's stages (data, model, train, finalize)."""
    overrides = [f"output_root={tmp_path / 'out'}", "arm=sft"]
    cfg, choices = compose_cfg(*overrides)
    sweep_dir = tmp_path / "sweep"
    hc = SimpleNamespace(mode=RunMode.MULTIRUN, overrides=SimpleNamespace(task=overrides), job=SimpleNamespace(num=0),
                         runtime=SimpleNamespace(choices=choices), sweep=SimpleNamespace(dir=str(sweep_dir)))
    monkeypatch.setattr(cli, "HydraConfig", SimpleNamespace(get=lambda: hc))
    # the entry's setup_logging finds a handler and leaves the harness logger as it is (propagating, for pytest)
    monkeypatch.setattr(logging.getLogger("harness"), "handlers", [logging.NullHandler()])

    def _job(ends):
        monkeypatch.setattr(lifecycle, "run_recipe", lambda plan, run, parent_s=0.0: ends())
        try:
            outcome = cli._entry(cfg)  # hydra.main hands a given config straight to the job function
        except SystemExit as exc:
            outcome = exc
        record = json.loads((sweep_dir / "jobs" / "0.json").read_text())
        manifest = json.loads((Path(record["run_dir"]) / "run_manifest.json").read_text())
        return outcome, record, manifest

    return _job


def said(record: dict) -> str:
    return f"{record['status']!r}, exit {record['exit_code']}, error {(record['error'] or {}).get('type')}"


def test_a_job_ended_by_sigterm_is_recorded_interrupted_not_failed(job):
    def sigterm():
        raise Halted("interrupted", 3, "checkpoint-3", signum=signal.SIGTERM)

    outcome, record, manifest = job(sigterm)
    assert (record["status"], record["exit_code"], record["error"]) == ("interrupted", 143, None), \
        f"the job's record says {said(record)}"
    assert isinstance(outcome, SystemExit) and outcome.code == 143  # the sweep stops; the same command continues it
    assert manifest["status"] == "interrupted" and manifest["halt"]["signal"] == "SIGTERM"


def test_a_paused_job_is_recorded_paused(job):
    def pause():
        raise Halted("paused", 3, "checkpoint-3")

    outcome, record, manifest = job(pause)
    assert (record["status"], record["exit_code"], record["error"]) == ("paused", 0, None), \
        f"the job's record says {said(record)}"
    assert outcome is None and manifest["status"] == "paused"


def test_a_job_that_raised_is_recorded_failed_and_the_sweep_goes_on(job):
    def crash():
        raise RuntimeError("boom in the train stage")

    outcome, record, manifest = job(crash)
    assert record["status"] == "failed" and record["exit_code"] is None, \
        f"the job's record says {said(record)}"
    assert record["error"]["type"] == "RuntimeError" and record["error"]["message"] == "boom in the train stage"
    assert outcome is None  # not raised: the next job runs
    assert manifest["status"] == "failed" and manifest["error"]["type"] == "RuntimeError"


def test_the_sweep_summary_counts_paused_and_interrupted_jobs_apart_from_failed_ones(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for num, (status, code) in enumerate([("completed", 0), ("paused", 0), ("failed", None), ("interrupted", 143)]):
        (jobs / f"{num}.json").write_text(json.dumps({"job": num, "status": status, "overrides": [f"seed={num}"],
                                                      "exit_code": code}))
    monkeypatch.setattr(sweep, "_FAILED_JOBS", [])
    monkeypatch.setattr(sweep, "_INTERRUPTED_JOBS", [])
    config = SimpleNamespace(hydra=SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)), launcher={}))
    sweep.SweepCallback().on_multirun_end(config)
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert (summary["jobs"], summary["completed"], summary["paused"], summary["interrupted"], summary["failed"]) == \
        (4, 1, [1], [3], [2])
    assert sweep._FAILED_JOBS == [2] and sweep._INTERRUPTED_JOBS == [(3, 143)]
    assert sweep.exit_code() == 1  # a failed job wins over an interrupted one


def test_a_scheduler_requeue_runs_after_the_job_is_recorded_interrupted(job, tmp_path):
    """submitit's SIGUSR2 handler requeues the SLURM job and exits the process (sys.exit(-1)). It must run after the
    run is marked interrupted and the sweep job's record says so: called before, the job was recorded `failed` (the
    record's default) and the requeued attempt looked like a failure."""
    seen = []

    def submitit_handler(signum, frame):
        record = json.loads((tmp_path / "sweep" / "jobs" / "0.json").read_text())
        seen.append((signum, record["status"], record["exit_code"]))
        raise SystemExit(-1)  # what submitit's handler does after `scontrol requeue`

    def usr2():
        raise Halted("interrupted", 3, "checkpoint-3", signum=signal.SIGUSR2, then=submitit_handler)

    outcome, record, manifest = job(usr2)
    assert seen == [(signal.SIGUSR2, "interrupted", 140)], "the requeue ran before the job's record was written"
    assert isinstance(outcome, SystemExit) and outcome.code == -1  # submitit's own exit, after the record
    assert record["status"] == "interrupted" and manifest["status"] == "interrupted"


def test_the_sweep_counts_its_jobs_and_each_job_says_which_of_them_it_is(job, monkeypatch, caplog):
    """`-m sweep=arms_x_seeds arm=grpo,papo` runs 2 x 3 jobs (the command line's arm wins over the sweep's): the
    launching process counts them, and every job prints "job N of M" before it runs."""
    from omegaconf import OmegaConf

    config = OmegaConf.create({"hydra": {
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {"arm": "grpo,papo,evi_po", "seed": "0,1,2"}},
        "overrides": {"task": ["arm=grpo,papo", "debug=tiny"]}}})
    assert sweep.sweep_size(config) == 6
    config.hydra.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweep.sweep_size(config) is None  # its trials, not a product of values
    monkeypatch.setenv(sweep.SWEEP_SIZE_ENV, "unset")  # restored (removed) after the test
    config.hydra.sweeper._target_ = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
    sweep.SweepCallback().on_multirun_start(config)
    assert __import__("os").environ[sweep.SWEEP_SIZE_ENV] == "6"
    with caplog.at_level(logging.INFO, logger="harness"):
        job(lambda: None)
    assert any(r.getMessage().startswith("sweep: job 1 of 6 (#0): output_root=") for r in caplog.records), \
        [r.getMessage() for r in caplog.records][:5]


def test_the_objective_is_not_printed_to_a_sweep_that_did_not_ask_for_it(compose_cfg, tmp_path, monkeypatch, caplog):
    """The objective (what a sweeper such as optuna optimizes) was printed after every job of every sweep
    ('objective eval/accuracy = ...'): it is a debug line; the job's record keeps the value for a sweeper."""
    import harness.report.runs as runs

    cfg, _ = compose_cfg(f"output_root={tmp_path}")
    monkeypatch.setattr(runs, "read_run", lambda path: SimpleNamespace(metrics={"eval/accuracy": 0.625}))
    with caplog.at_level(logging.DEBUG, logger="harness"):
        assert sweep.objective(cfg, [f"output_root={tmp_path}"]) == 0.625
    said = [r for r in caplog.records if r.getMessage().startswith("objective")]
    assert said and all(r.levelno == logging.DEBUG for r in said), [(r.levelname, r.getMessage()) for r in said]
