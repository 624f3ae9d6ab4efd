"""What a new user trips over in the first hour (issue 39): each test fails on the main of 2026-12-05."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from tests.conftest import REPO, run_harness


def test_mode_plan_refuses_an_output_root_the_run_would_refuse(tmp_path):
    """Item 4: an output_root under a file was planned (exit 0) and refused by the run (exit 2); mode=plan now runs
    the run's filesystem check without writing anything."""
    (tmp_path / "afile").write_text("x")
    proc = run_harness("mode=plan", f"output_root={tmp_path / 'afile' / 'out'}")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert "output_root" in proc.stderr and "is a file, not a directory" in proc.stderr
    fresh = tmp_path / "new" / "deeper"
    proc = run_harness("mode=plan", f"output_root={fresh}")
    assert proc.returncode == 0 and json.loads(proc.stdout)["run_dir"].startswith(str(fresh))
    assert not (tmp_path / "new").exists()  # the plan writes nothing


def test_a_trl_style_flag_gets_its_hydra_form(tmp_path):
    """Item 5: `--output_root=/tmp/x` printed Hydra's raw argparse usage; now one problem with the key=value form
    (the schema's key: --learning_rate is arm.learning_rate)."""
    proc = run_harness(f"--output_root={tmp_path}")
    assert proc.returncode == 2 and f"fix: write output_root={tmp_path}" in proc.stderr, proc.stderr[-2000:]
    assert "usage:" not in proc.stderr
    proc = run_harness("--learning_rate", "1e-5", "arm=papo")
    assert proc.returncode == 2 and "fix: write arm.learning_rate=1e-5" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "runs").exists()


def test_help_lists_no_empty_group():
    """Item 7: `--help` listed an empty `hydra:` group (conf/hydra holds only hydra/launcher)."""
    proc = run_harness("--help")
    groups = proc.stdout.split("== Config groups (group=option) ==")[1].split("\n\n")[0].splitlines()
    assert all(line.split(":", 1)[1].strip() for line in groups if line.strip()), groups
    assert any(line.strip().startswith("hydra/launcher (with -m): slurm") for line in groups)


def test_a_sweep_dir_keeps_no_empty_job_folders(tmp_path):
    """Item 7: Hydra's launcher makes <sweep dir>/<n>/ for every job and the harness writes nothing there: the
    sweep's end removes the empty ones (not a launcher's non-empty ones, not jobs/)."""
    from harness.sweep import SweepCallback

    sweep = tmp_path / "sweep"
    for n in ("0", "1", "2"):
        (sweep / n).mkdir(parents=True)
    (sweep / "2" / "launcher.log").write_text("kept")
    (sweep / "jobs").mkdir()
    (sweep / "jobs" / "0.json").write_text(json.dumps({"job": 0, "status": "completed"}))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}, "launcher": {"_target_": "basic"}}})
    SweepCallback().on_multirun_end(cfg)
    assert sorted(p.name for p in sweep.iterdir()) == ["2", "jobs", "sweep.json"]


def test_the_docs_agree_on_how_long_debug_tiny_takes():
    """Item 7: debug=tiny was 'about 20 s' in the README and 'about 30 s' in its config and the group table (now in
    docs/config.md)."""
    paths = ("README.md", "docs/config.md", "conf/debug/tiny.yaml", "conf/config.yaml")
    texts = [(REPO / p).read_text() for p in paths]
    assert not any("about 30 s" in t for t in texts)
    assert all("about 20 s" in t for t in texts)
