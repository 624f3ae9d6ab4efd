"""Hydra launchers for sweeps: the SLURM (submitit) config composes and resolves against the job's config; the
submitit machinery runs real jobs (its local executor, the same code path minus sbatch); the driver form's
command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import run_harness


def _launcher(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from harness.cli import CONF_DIR
    from harness.config.store import register

    register(with_help=False)  # the structured schemas the config's defaults name (this module may run alone)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="harness"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    OmegaConf.resolve(cfg)  # interpolations into the job config (placement, output_root) resolve
    return OmegaConf.to_container(cfg.hydra.launcher)


def test_slurm_launcher_config_asks_one_task_with_a_gpu_per_rank():
    cfg = _launcher("placement=ddp", "placement.num_processes=4", "hydra.launcher.partition=gpu",
                    "output_root=/scratch/x")
    assert cfg["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert cfg["tasks_per_node"] == 1 and cfg["gpus_per_node"] == 4 and cfg["nodes"] == 1
    assert cfg["partition"] == "gpu" and cfg["max_num_timeout"] == 3
    assert cfg["submitit_folder"] == "/scratch/x/slurm/%j"
    assert cfg["setup"][0].startswith("source /") and cfg["setup"][0].endswith("/.venv/bin/activate")


def test_slurm_launcher_instantiates():
    from hydra.utils import instantiate

    cfg = _launcher("placement=ddp")
    launcher = instantiate(cfg)
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["gpus_per_node"] == 2


@pytest.mark.slow  # ~30 s
def test_submitit_executor_runs_a_sweep(tmp_path):
    proc = run_harness("-m", "hydra/launcher=submitit_local", "arm=sft", "debug=tiny", "budget.max_steps=2",
                       "seed=0,1", f"output_root={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "sweeps").iterdir()
    summary = json.loads((sweep / "sweep.json").read_text())
    assert summary["completed"] == 2 and "LocalLauncher" in summary["launcher"]
    for job in summary["runs"]:
        assert json.loads((tmp_path / "runs" / job["run_dir"].split("/")[-1] / "completion.json").read_text())[
            "optimizer_steps"] == 2


def test_driver_command_line(plan_of):
    from harness.launch import launch_command

    plan = plan_of("placement=ddp", "placement.num_processes=2")
    cmd = launch_command(plan)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[-2:] == ["-m", "harness"]
    assert cmd[cmd.index("--num_processes") + 1] == "2" and "--multi_gpu" in cmd  # --cpu would run ONE process
    assert cmd[cmd.index("--config_file") + 1].endswith("accelerate/ddp.yaml")
    assert cmd[cmd.index("--mixed_precision") + 1] == "no"



@pytest.mark.parametrize("launcher_code, rank0, expected", [
    (0, "0", 0),
    (1, "5", 5),  # rank 0's own code (e.g. RunDirStateError) instead of the launcher's generic 1
    (1, "0", 1),  # rank 0 finished but another rank failed: still a failure
    (1, None, 1),  # rank 0 was killed before it could write its code
])
def test_driver_exit_code(plan_of, monkeypatch, launcher_code, rank0, expected):
    import harness.launch as L

    plan = plan_of("placement=ddp")

    class FakeProc:
        pid = 0

        def __init__(self, cmd, env, **kw):
            if rank0 is not None:
                Path(env[L.EXIT_ENV]).write_text(rank0 + "\n")

        def wait(self, timeout=None):
            return launcher_code

    monkeypatch.setattr(L.subprocess, "Popen", FakeProc)
    assert L.launch(plan) == expected
