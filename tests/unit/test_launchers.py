"""Hydra launchers for sweeps: the SLURM (submitit) config composes and resolves against the job's config; the
submitit machinery runs real jobs (its local executor, the same code path minus sbatch); the driver form's
command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import run_harness


def _launcher(*overrides: str, launcher: str = "hydra/launcher=slurm") -> dict:
    from hydra import compose, initialize_config_dir

    from harness.cli import CONF_DIR
    from harness.config.store import register

    register(with_help=False)  # the structured schemas the config's defaults name (this module may run alone)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="harness"):
        cfg = compose(config_name="config", overrides=[launcher, *overrides], return_hydra_config=True)
    OmegaConf.resolve(cfg)  # interpolations into the job config (placement, output_root) resolve
    return OmegaConf.to_container(cfg.hydra.launcher)


def test_slurm_launcher_config_asks_one_task_with_a_gpu_per_rank():
    cfg = _launcher("placement=ddp", "placement.num_processes=4", "hydra.launcher.partition=gpu",
                    "output_root=/scratch/x")
    assert cfg["_target_"] == "hydra_plugins.harness_slurm.launcher.SlurmLauncher"
    assert cfg["tasks_per_node"] == 1 and cfg["gpus_per_node"] == 4 and cfg["nodes"] == 1
    assert cfg["cpus_per_task"] == 4 * 8 and cfg["mem_gb"] == 4 * 32  # per rank: 8 CPUs, 32 GB on a GPU placement
    assert cfg["partition"] == "gpu" and cfg["max_num_timeout"] == 3
    assert cfg["additional_parameters"] == {"requeue": True}  # a preemption or `scontrol requeue` puts it back
    assert cfg["submitit_folder"] == "/scratch/x/slurm/%j"
    import sys

    assert cfg["setup"][0] == f"export PATH={Path(sys.executable).parent}:$PATH"  # the submitting environment


@pytest.mark.parametrize("launcher, overrides, asked", [
    ("slurm", ("placement.device=cpu",), (1, None, 1, 4)),  # a CPU placement asks for no GPU
    ("slurm_cpu", ("placement=ddp",), (1, None, 2, 8)),  # no GPU whatever the device says; 1 CPU, 4 GB per rank
    ("slurm_cpu", ("placement=ddp", "placement.cpus_per_process=3", "placement.mem_gb_per_process=5"), (1, None, 6, 10)),
    ("slurm", ("placement=ddp", "placement.num_processes=8", "placement.num_machines=4"), (4, 8, 64, 256)),
])
def test_the_slurm_request_comes_from_the_placement(launcher, overrides, asked):
    """(nodes, gpus_per_node, cpus_per_task, mem_gb): a node per machine, a GPU per rank on a GPU placement, and
    placement.cpus_per_process / mem_gb_per_process per rank."""
    cfg = _launcher(*overrides, launcher=f"hydra/launcher={launcher}")
    assert (cfg["nodes"], cfg["gpus_per_node"], cfg["cpus_per_task"], cfg["mem_gb"]) == asked


def test_slurm_launcher_instantiates():
    from hydra.utils import instantiate

    cfg = _launcher("placement=ddp")
    launcher = instantiate(cfg)
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["gpus_per_node"] == 2


def test_hydra_finds_the_harness_launcher_among_its_plugins():
    """Hydra takes launchers only from the hydra_plugins namespace (hydra_plugins/harness_slurm, installed with the
    project): a launcher defined elsewhere is refused with 'not the hydra_plugins package'."""
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    names = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}
    assert "hydra_plugins.harness_slurm.launcher.SlurmLauncher" in names


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
    assert cmd[cmd.index("--num_machines") + 1] == "1" and "--machine_rank" not in cmd


def test_driver_command_line_on_the_second_of_two_machines(plan_of):
    """placement.num_processes is per machine; accelerate's --num_processes is the job's world size."""
    from harness.launch import Machine, launch_command

    plan = plan_of("placement=ddp", "placement.num_processes=4", "placement.num_machines=2")
    cmd = launch_command(plan, Machine(1, "10.0.0.7", 29555, "test"))
    arg = lambda k: cmd[cmd.index(k) + 1]  # noqa: E731
    assert (arg("--num_processes"), arg("--num_machines"), arg("--machine_rank")) == ("8", "2", "1")
    assert (arg("--main_process_ip"), arg("--main_process_port")) == ("10.0.0.7", "29555")
    assert plan.cfg.placement.world_size == 8 and plan.round.world == 8  # what the budget and the round split over


@pytest.mark.parametrize("env, expected", [
    ({"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29555"}, (1, "10.0.0.7", 29555)),
    ({"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29555", "SLURM_JOB_ID": "5"}, (1, "10.0.0.7", 29555)),
    ({"SLURM_JOB_ID": "123", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "127.0.0.1,localhost"}, (1, "127.0.0.1", 20123)),
])
def test_where_the_machines_meet(plan_of, env, expected):
    """NODE_RANK / MASTER_ADDR / MASTER_PORT when set (any cluster), else the SLURM job's node id, its first node's
    address and a port from its job id (the same on every node, another for each job)."""
    from harness.launch import Machine

    plan = plan_of("placement=ddp", "placement.num_processes=1", "placement.num_machines=2")
    m = Machine.of(plan, env)
    assert (m.rank, m.main_address, m.main_port) == expected


@pytest.mark.parametrize("env, says", [
    ({}, "neither NODE_RANK/MASTER_ADDR/MASTER_PORT nor a SLURM job"),
    ({"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7"}, "MASTER_PORT not set"),
    ({"NODE_RANK": "2", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "1"}, "machine ranks go from 0 to 1"),
    ({"SLURM_JOB_ID": "9", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost"}, "this SLURM job has 1 node(s)"),
])
def test_a_machine_that_cannot_tell_where_it_is_is_refused_with_the_fix(plan_of, env, says):
    from harness.errors import ConfigError
    from harness.launch import Machine

    plan = plan_of("placement=ddp", "placement.num_processes=1", "placement.num_machines=2")
    with pytest.raises(ConfigError) as err:
        Machine.of(plan, env)
    assert "placement.num_machines = 2" in str(err.value) and says in str(err.value), str(err.value)
    assert "fix:" in str(err.value)


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


def test_machines_split_the_world_not_the_run(plan_of):
    """placement.num_machines is how the ranks are placed, not what is trained: 2 machines x 1 rank is the run that
    1 machine x 2 ranks is (same name, semantic hash and generation round), so either resumes the other."""
    two_nodes = plan_of("placement=ddp", "placement.num_processes=1", "placement.num_machines=2")
    one_node = plan_of("placement=ddp", "placement.num_processes=2")
    assert two_nodes.run_name == one_node.run_name
    assert two_nodes.identity["semantic_sha256"] == one_node.identity["semantic_sha256"]
    assert two_nodes.round.describe() == one_node.round.describe() and two_nodes.round.world == 2
    from harness.identity import config_hashes  # the new placement fields at their defaults: old runs keep their hashes

    plan = plan_of()
    new = ("num_machines", "collective_timeout_s", "cpus_per_process", "mem_gb_per_process")
    before = {**plan.config, "placement": {k: v for k, v in plan.config["placement"].items() if k not in new}}
    assert config_hashes(before, plan.identity["non_semantic_fields"]) == \
        (plan.identity["config_sha256"], plan.identity["semantic_sha256"])


@pytest.mark.parametrize("overrides, says", [
    (("placement.num_machines=2",), "placement=single runs one process on one machine"),
    (("placement=ddp", "placement.num_processes=1", "placement.num_machines=2", "run_mode=smoke"),
     "the smoke self-test relaunches its run on this machine"),
    (("placement=ddp", "placement.num_processes=3", "placement.num_machines=2", "arm.prompts_per_step=4"),
     "the job's 6 rank(s) (placement.num_machines x placement.num_processes)"),
])
def test_placements_over_machines_that_cannot_run_are_refused_at_plan_time(plan_of, overrides, says):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        plan_of(*overrides)
    assert says in str(err.value), str(err.value)


def test_a_slurm_sweep_where_there_is_no_slurm_says_so(tmp_path):
    """No sbatch (a laptop, a node without SLURM's client): exit 2 naming the launcher and what to do, no traceback."""
    import sys

    proc = run_harness("-m", "hydra/launcher=slurm_cpu", "arm=sft", "debug=tiny", f"output_root={tmp_path}",
                       env={"PATH": str(Path(sys.executable).parent)}, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "hydra/launcher = 'slurm': SLURM's sbatch, srun, scontrol not found on PATH" in proc.stderr, proc.stderr
    assert "fix: run the sweep on a machine of the cluster" in proc.stderr and "Traceback" not in proc.stderr
