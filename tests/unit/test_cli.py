"""The CLI as a user meets it: mode=plan JSON, torch-free and fast; errors without tracebacks; --help, --cfg."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, heavy_imports, run_harness


def test_mode_plan_prints_json_is_torch_free_and_writes_nothing(tmp_path):
    out_root = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "mode=plan", f"output_root={out_root}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert len(plan["identity"]["config_sha256"]) == 64 and len(plan["identity"]["semantic_sha256"]) == 64
    assert plan["run_dir"] == str(out_root / "runs" / plan["run_name"])
    assert {"budget", "checkpoints", "config"} <= set(plan)
    assert heavy_imports(proc.stderr) == []
    assert not out_root.exists()
    assert list(tmp_path.iterdir()) == [], "mode=plan wrote into the working directory"


def test_mode_plan_imports_only_the_control_plane(tmp_path):
    """What mode=plan loads, not how long it takes (a wall-time ratio flakes on a loaded 2-core machine): the
    third-party packages it imports are hydra's, omegaconf's and yaml's, nothing that trains or plots."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "mode=plan",
                           f"output_root={tmp_path}"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    top = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.count("|") == 2}
    third_party = {m for m in top if not m.startswith("_") and m not in sys.stdlib_module_names}
    allowed = {"harness", "arms", "hydra", "omegaconf", "antlr4", "yaml", "attr", "packaging", "sitecustomize",
               "org", "imported package",  # org: antlr4's; "imported package": the importtime header
               "hydra_plugins"}  # Hydra's plugin scan on a cold compose (the harness's launcher, which imports
    # hydra-submitit-launcher's module: Hydra's scan exec's the others without an import statement)
    assert third_party <= allowed, sorted(third_party - allowed)


def test_identity_stable_across_processes(tmp_path):
    a = json.loads(run_harness("mode=plan", f"output_root={tmp_path}").stdout)["identity"]
    b = json.loads(run_harness("mode=plan", f"output_root={tmp_path}").stdout)["identity"]
    c = json.loads(run_harness("mode=plan", f"output_root={tmp_path}", "seed=1").stdout)["identity"]
    d = json.loads(run_harness("mode=plan", f"output_root={tmp_path}", "logger=tensorboard").stdout)["identity"]
    assert a == b
    assert c["semantic_sha256"] != a["semantic_sha256"]
    assert d["config_sha256"] != a["config_sha256"] and d["semantic_sha256"] == a["semantic_sha256"]


def test_unknown_arm_lists_the_arms_without_traceback():
    proc = run_harness("arm=nope", "mode=plan")
    assert proc.returncode != 0
    for arm in ("grpo", "papo", "evi_po", "sft"):
        assert arm in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_misspelled_group_key_fails_at_compose_time_without_traceback():
    proc = run_harness("armm=grpo", "mode=plan")
    assert proc.returncode != 0 and "armm" in proc.stderr and "Traceback" not in proc.stderr


def test_wrong_type_names_field_and_value():
    proc = run_harness("arm.num_generations=eight", "mode=plan")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "arm.num_generations" in proc.stderr and "eight" in proc.stderr


def test_config_error_exits_2_listing_every_problem():
    proc = run_harness("mode=plan", "arm.learning_rate=0", "budget.max_completion_tokens=1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "2 problems" in proc.stderr and "arm.learning_rate" in proc.stderr
    assert "budget.max_completion_tokens" in proc.stderr and "fix:" in proc.stderr


def test_help_and_cfg_job():
    h = run_harness("--help")
    assert h.returncode == 0 and "arm: evi_po, grpo, opd, papo, sft" in h.stdout and "arm.gamma" in h.stdout
    assert "schema/" not in h.stdout.split("Fields")[0]
    c = run_harness("--cfg", "job", "arm=papo")
    assert c.returncode == 0 and "gamma: 0.02" in c.stdout and "Traceback" not in c.stderr


def test_the_harness_console_script_and_its_tab_completion(tmp_path):
    """`harness` is `python -m harness` (pyproject [project.scripts]); Hydra's bash completion needs it (under
    `python -m` the completion script looks for a file after `python` and gives up)."""
    from pathlib import Path

    exe = Path(sys.executable).parent / "harness"
    assert exe.is_file(), f"{exe}: the console script is not installed (scripts/ensure_venv.sh installs it)"
    h = subprocess.run([str(exe), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "experiment=<name>" in h.stdout and "harness -sc install=bash" in h.stdout
    install = subprocess.run([str(exe), "-sc", "install=bash"], capture_output=True, text=True, timeout=60)
    assert install.returncode == 0 and install.stdout.rstrip().endswith("hydra_bash_completion harness")

    def complete(line: str) -> list[str]:
        proc = subprocess.run([str(exe), "-sc", "query=bash"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COMP_LINE": line, "COMP_POINT": str(len(line))})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("harness arm=") == ["arm=evi_po", "arm=grpo", "arm=opd", "arm=papo", "arm=sft"]
    assert set(complete("harness experiment=")) == {"experiment=comparison", "experiment=evi_po_direction_only",
                                                  "experiment=tune_papo"}
    assert complete("harness arm=evi_po arm.lambda_") == ["arm.lambda_direction=", "arm.lambda_evidence="]
    p = subprocess.run([str(exe), "mode=plan", "experiment=evi_po_direction_only", f"output_root={tmp_path}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and json.loads(p.stdout)["config"]["arm"]["lambda_evidence"] == 0.0


def test_cfg_job_is_torch_free():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "--cfg", "job"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and heavy_imports(proc.stderr) == []


def test_vllm_rollout_refused_naming_what_is_missing():
    import importlib.util

    from harness.config.checks import cuda_visible

    if importlib.util.find_spec("vllm") is not None and cuda_visible():
        pytest.skip("vllm and a CUDA device are here: nothing is missing (the gpu tests run the rollout)")
    proc = run_harness("mode=plan", "rollout=vllm_colocate")
    assert proc.returncode == 2
    assert importlib.util.find_spec("vllm") is not None or "vllm is not installed" in proc.stderr
    assert cuda_visible() or "need a CUDA device" in proc.stderr


def test_sweep_records_every_job_and_a_failing_job_does_not_end_it(tmp_path):
    proc = run_harness("-m", "mode=plan", "arm.learning_rate=-1,1e-4", f"output_root={tmp_path}")
    assert proc.returncode == 1 and "1 failed job(s)" in proc.stderr and "Traceback" not in proc.stderr
    (sweep,) = (tmp_path / "sweeps").iterdir()
    failed = json.loads((sweep / "jobs" / "0.json").read_text())
    ok = json.loads((sweep / "jobs" / "1.json").read_text())
    assert failed["status"] == "failed" and failed["exit_code"] == 2 and failed["run_dir"] is None
    assert ok["status"] == "completed" and ok["run_dir"].startswith(str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()  # mode=plan jobs write no run dir
    # the record names the run dir the job's own plan named (remembered, not planned again): the same as planning
    # the job's overrides from scratch
    from harness.plan import compose_plan

    assert ok["run_dir"] == compose_plan(ok["overrides"]).run_dir


@pytest.mark.slow  # ~20 s each; a sweep's jobs planned: test_sweep_records_every_job_and_a_failing_job_does_not_end_it
@pytest.mark.parametrize("name, jobs", [("arms_x_seeds", 12), ("papo_ablation", 36), ("evi_po_ablation", 27),
                                        ("staleness", 12)])
def test_named_sweeps_compose_and_plan_every_job(tmp_path, name, jobs):
    proc = run_harness("-m", f"sweep={name}", "mode=plan", "debug=tiny", f"output_root={tmp_path}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((next((tmp_path / "sweeps").iterdir()) / "sweep.json").read_text())
    assert summary["jobs"] == summary["completed"] == jobs
    run_dirs = {r["run_dir"] for r in summary["runs"]}
    assert len(run_dirs) == jobs  # every job is a distinct run


def test_a_named_sweep_without_multirun_is_refused():
    proc = run_harness("sweep=arms_x_seeds", "mode=plan")
    assert proc.returncode == 2 and "sweep = 'arms_x_seeds'" in proc.stderr and "-m sweep=arms_x_seeds" in proc.stderr
