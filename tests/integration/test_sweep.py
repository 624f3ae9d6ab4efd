"""Multirun sweeps end to end with the real trainers: the acceptance sweep of issue 7 (four debug runs with
eval artifacts), a failing job that does not stop the others (at plan time, and mid-training under joblib), and
Hydra's joblib launcher running jobs in parallel that share one SFT warm start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.verify import verify
from tests.conftest import heavy_imports, run_harness, wandb_run_record


def tensorboard_tags(logdir: Path) -> set[str]:
    """Every scalar tag in a TensorBoard log dir (all its event files, subfolders included)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return {tag for run in mux.Runs().values() for tag in run.get("scalars", [])}


def _sweep_dir(out: Path) -> Path:
    (d,) = (out / "sweeps").iterdir()
    return d


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """`-m arm=grpo,sft seed=0,1 debug=tiny` plus a fifth job whose config is refused at plan time."""
    out = tmp_path_factory.mktemp("sweep")
    proc = run_harness("-m", "arm=grpo,sft", "seed=0,1", "debug=tiny", f"output_root={out}", timeout=900)
    return out, proc


@pytest.mark.slow  # the fixture is a 4-job sweep (~115 s); test_cli plans every named sweep
def test_four_runs_complete_each_with_an_eval_artifact(sweep):
    out, proc = sweep
    assert proc.returncode == 0, proc.stderr[-4000:]
    sd = _sweep_dir(out)
    summary = json.loads((sd / "sweep.json").read_text())
    assert summary["jobs"] == summary["completed"] == 4 and summary["failed"] == []
    runs = [Path(r["run_dir"]) for r in summary["runs"]]
    assert sorted(r.name.split("-")[0] + "-s" + r.name.split("-s")[-1][0] for r in runs) == \
        ["grpo-s0", "grpo-s1", "sft-s0", "sft-s1"]
    for r in runs:
        comp = json.loads((r / "completion.json").read_text())
        assert comp["status"] == "completed" and comp["eval_after"]["n"] == 64
        assert (r / "eval" / "test.json").is_file() and verify(r) == []
    # the RL jobs of a seed use that seed's warm start; the two warm starts are distinct runs
    parents = {json.loads((r / "run_manifest.json").read_text())["parent"]["run_dir"]
               for r in runs if r.name.startswith("grpo")}
    assert len(parents) == 2 and all(verify(Path(p)) == [] for p in parents)
    assert "4 job(s), 4 completed, 0 failed" in proc.stderr


def _png_ok(path: Path) -> bool:
    import matplotlib.image

    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and matplotlib.image.imread(path).ndim == 3


@pytest.mark.slow  # the fixture is a 4-job sweep (~115 s); test_cli plans every named sweep
def test_report_over_the_output_root_is_torch_free_and_names_both_arms(sweep):
    out, _ = sweep
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness.report", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert heavy_imports(proc.stderr) == []
    md = (out / "report" / "report.md").read_text()
    assert "| grpo |" in md and "| sft (budget.max_steps=64) |" in md and "(warm start)" in md
    pngs = sorted((out / "report").glob("*.png"))
    assert len(pngs) >= 2 and all(_png_ok(p) for p in pngs)


@pytest.mark.slow  # the fixture is a 4-job sweep (~115 s); test_cli plans every named sweep
def test_report_over_the_sweep_folder_compares_its_jobs_only(sweep):
    from harness.report.cli import build_report

    out, _ = sweep
    rep, md = build_report(_sweep_dir(out))
    (group,) = rep["groups"]
    assert [c["label"] for c in group["conditions"]] == ["sft", "grpo"]  # fixed arm order; warm starts not jobs
    assert rep["counts"]["runs"] == 4 and rep["failed_jobs"] == []
    grpo = next(c for c in group["conditions"] if c["label"] == "grpo")
    accs = [json.loads((Path(r["path"]) / "eval" / "test.json").read_text())["accuracy"] for r in grpo["runs"]]
    assert grpo["metrics"]["eval/accuracy"]["mean"] == pytest.approx(sum(accs) / 2)
    assert grpo["metrics"]["eval/accuracy"]["n"] == 2 and grpo["metrics"]["budget/fraction"]["mean"] <= 1.0
    # an SFT condition is not paired against the RL baseline (budgets of another kind) unless it is the baseline
    assert [u["condition"] for u in group["unpaired"]] == ["sft"] and group["paired"] == []
    rep, _ = build_report(_sweep_dir(out), baseline="sft")
    pair = next(p for p in rep["groups"][0]["paired"] if p["condition"] == "grpo" and p["metric"] == "eval/accuracy")
    assert pair["n"] == 2


@pytest.mark.slow  # test_cli.py::test_sweep_records_every_job_and_a_failing_job_does_not_end_it stays
def test_a_failing_job_is_recorded_the_others_complete_and_the_report_lists_it(tmp_path):
    proc = run_harness("-m", "arm=sft", "debug=tiny", "budget.max_steps=0,4", f"output_root={tmp_path}", timeout=600)
    assert proc.returncode == 1 and "1 failed job(s)" in proc.stderr and "Traceback" not in proc.stderr
    summary = json.loads((_sweep_dir(tmp_path) / "sweep.json").read_text())
    assert summary["failed"] == [0] and summary["completed"] == 1
    ok = Path(summary["runs"][1]["run_dir"])
    assert json.loads((ok / "completion.json").read_text())["optimizer_steps"] == 4
    rep = run_harness(str(_sweep_dir(tmp_path)), module="harness.report", timeout=120)
    assert rep.returncode == 0, rep.stderr
    md = (_sweep_dir(tmp_path) / "report" / "report.md").read_text()
    failed = md[md.index("## Failed jobs"):]
    assert "budget.max_steps=0" in failed and "exit" in failed.lower()


@pytest.mark.slow  # the default suite stays near 15 min; the basic launcher: tests/unit/test_cli.py
def test_joblib_jobs_share_the_warm_start_and_a_crash_mid_training_spares_the_other_job(tmp_path):
    """Hydra's joblib launcher, two jobs in parallel sharing one SFT warm start; the grpo job raises inside
    training (end of step 3, after checkpoint 2). The papo job completes, the sweep records the crash (exit 1, the
    exception named, the run left `failed`, consistent for verify), and the same command again resumes the crashed
    run from its checkpoint and leaves the completed one alone: nothing accepted is lost."""
    from harness.faults import KILL_HOW_ENV, KILL_RUN_ENV, KILL_STEP_ENV

    args = ["-m", "arm=grpo,papo", "seed=0", "debug=tiny", "train.eval_after=false", "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2", f"output_root={tmp_path}"]
    grpo = json.loads(run_harness("mode=plan", "arm=grpo", "seed=0", "debug=tiny", "train.eval_after=false",
                                  f"output_root={tmp_path}").stdout)
    fault = {KILL_RUN_ENV: grpo["run_name"], KILL_STEP_ENV: "3", KILL_HOW_ENV: "raise"}
    proc = run_harness(*args, env=fault, timeout=900)
    assert proc.returncode == 1 and "1 failed job(s)" in proc.stderr, proc.stderr[-4000:]
    assert "sweep job 0 failed: InjectedFault" in proc.stderr
    summary = json.loads((_sweep_dir(tmp_path) / "sweep.json").read_text())
    assert "Joblib" in summary["launcher"] and summary["failed"] == [0] and summary["completed"] == 1
    job = json.loads((_sweep_dir(tmp_path) / "jobs" / "0.json").read_text())
    assert job["error"]["type"] == "InjectedFault" and job["run_dir"] == grpo["run_dir"]
    crashed, papo = Path(grpo["run_dir"]), Path(summary["runs"][1]["run_dir"])
    assert json.loads((crashed / "run_manifest.json").read_text())["status"] == "failed"
    assert not (crashed / "completion.json").exists() and verify(crashed) == []
    assert json.loads((papo / "completion.json").read_text())["status"] == "completed" and verify(papo) == []
    sft_runs = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("sft-")]
    assert len(sft_runs) == 1  # computed once, by whichever job took its lock first
    parents = {json.loads((Path(r["run_dir"]) / "run_manifest.json").read_text())["parent"]["run_dir"]
               for r in summary["runs"]}
    assert parents == {str(sft_runs[0])}

    papo_bytes = (papo / "completion.json").read_bytes()
    again = run_harness(*args, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "resuming from checkpoint-2" in again.stderr and f"run {papo.name} is already complete" in again.stderr
    audit = json.loads((crashed / "audits" / "resume-1-rank-0.json").read_text())
    assert audit["status"] == "passed" and audit["checkpoint"] == "checkpoint-2"
    assert json.loads((crashed / "completion.json").read_text())["status"] == "completed" and verify(crashed) == []
    assert (papo / "completion.json").read_bytes() == papo_bytes


def trackio_runs(db: Path) -> dict:
    """{run name: {"config": ..., "rows": {step: merged metrics}}} of a trackio project database (its SQLite
    tables, read without trackio)."""
    import sqlite3

    con = sqlite3.connect(db)
    runs = {name: {"config": json.loads(cfg), "rows": {}} for name, cfg in con.execute("SELECT run_name, config FROM configs")}
    for name, step, metrics in con.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id"):
        runs[name]["rows"].setdefault(step, {}).update(json.loads(metrics))
    con.close()
    return runs


@pytest.mark.slow  # ~30 s
def test_jobs_in_one_process_get_their_own_wandb_tensorboard_and_trackio_runs(tmp_path):
    """The basic launcher runs every job in one process: W&B caches its settings process-wide and TRL leaves
    its run open, so without closing them the second job logged into the first job's run dir. The trackio runs
    of both jobs share one database under output_root, each with its identity, its steps and the final eval."""
    proc = run_harness("-m", "arm=sft", "debug=tiny", "logger=[wandb,tensorboard,trackio]", "seed=0,1",
                       "budget.max_steps=3", "train.eval_steps=2", f"output_root={tmp_path}",
                       env={"WANDB_MODE": "offline", "TRACKIO_DIR": None}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Trackio project initialized" not in proc.stdout + proc.stderr  # its banner: one harness line instead
    tracked = trackio_runs(tmp_path / "trackio" / "harness.db")
    assert sorted(tracked) == sorted(r.name for r in (tmp_path / "runs").iterdir())
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    groups = set()
    for seed, run in enumerate(runs):
        (offline,) = (run / "wandb").glob("offline-run-*")
        tags = tensorboard_tags(run / "tensorboard")
        assert "train/loss" in tags and {"eval/accuracy_after", "budget/realized_loss_tokens"} <= tags, tags
        # the W&B run carries the harness run's identity (harness.trackers) and its final eval
        rec = wandb_run_record(next(offline.glob("*.wandb")))
        assert rec["name"] == run.name and {"sft", f"seed-{seed}", "tiny_vlm", "full"} <= set(rec["tags"])
        assert "harness" in rec["config_keys"] and rec["exit_code"] == 0
        assert rec["summary"]["eval/accuracy_after"] == json.loads((run / "completion.json").read_text())[
            "eval_after"]["accuracy"]
        assert rec["summary"]["budget/realized_loss_tokens"] > 0
        groups.add(rec["group"])
        # trackio: the same identity; every metrics.jsonl row's values, the periodic eval, the final figures
        tr = tracked[run.name]
        assert tr["config"]["_Group"] == rec["group"] and {"sft", f"seed-{seed}"} <= set(tr["config"]["tags"])
        assert tr["config"]["harness"]["config"]["arm"]["name"] == "sft"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            assert tr["rows"][row["step"]]["train/loss"] == pytest.approx(row["loss"])
        assert "eval/accuracy" in tr["rows"][2]  # the periodic eval at step 2
        last = tr["rows"][3]
        assert last["eval/accuracy_after"] == rec["summary"]["eval/accuracy_after"]
        assert last["budget/realized_loss_tokens"] == rec["summary"]["budget/realized_loss_tokens"]
    assert len(groups) == 1 and groups.pop().startswith("sft-")  # two seeds of one condition
    assert "URL not available" not in proc.stderr  # TRL's model card asked W&B at every save


@pytest.mark.slow
def test_an_optuna_sweep_optimizes_the_objective_of_finished_runs(tmp_path):
    """hydra/sweeper=optuna (conf/experiment/tune_papo.yaml): each trial is a harness run whose job returns its
    `objective` (eval/accuracy on the validation split here); the study's best value is the best trial's, and
    every trial trained the knobs Optuna chose."""
    import yaml

    out = tmp_path / "out"
    proc = run_harness("-m", "experiment=tune_papo", "debug=tiny", "hydra.sweeper.n_trials=2", f"output_root={out}",
                       timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (out / "sweeps").iterdir()
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    jobs = [json.loads(p.read_text()) for p in sorted((sweep / "jobs").glob("*.json"))]
    assert len(jobs) == 2 and all(j["status"] == "completed" for j in jobs)
    for j in jobs:
        run = Path(j["run_dir"])
        comp = json.loads((run / "completion.json").read_text())
        assert comp["eval_after"]["split"] == "val" and j["objective"] == comp["eval_after"]["accuracy"]
        cfg = json.loads((run / "run_manifest.json").read_text())["plan"]["config"]
        chosen = dict(o.split("=", 1) for o in j["overrides"] if o.startswith("arm."))
        assert cfg["arm"]["gamma"] == pytest.approx(float(chosen["arm.gamma"]))
        assert 0.0 <= cfg["arm"]["gamma"] <= 0.05 and cfg["arm"]["mask_ratio"] in (0.4, 0.6, 0.8)
    assert best["best_value"] == max(j["objective"] for j in jobs)
