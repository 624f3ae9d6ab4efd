"""A ported recipe runs as an experiment preset: `python -m harness.port ... --out conf/experiment/<name>.yaml`, then
`python -m harness experiment=<name>`. Run from a temporary copy of the repository (harness/, arms/, conf/,
sweeps/, accelerate/, pyproject.toml), so no file is left in the repository's conf/experiment/ (which
tests/unit/test_config_compose.py lists exactly) and tests running at the same time see nothing of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.test_port import FIX

# The PAPO fork's GRPO+PAPO recipe and its launch-script overrides, with the batch shrunk the same way (as a launch
# script would pass it) so that a round fits debug=tiny's 2,048-token budget: 8 prompts per rollout, 4 per step.
SHRUNK = ["algorithm.kl_prcp_coef=0.02", "data.rollout_batch_size=8", "worker.actor.global_batch_size=4",
          "worker.rollout.n=4", "data.max_response_length=16", "trainer.save_freq=1"]


def _copy_repo(dst: Path) -> Path:
    for name in ("harness", "arms", "conf", "sweeps", "accelerate"):
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "pyproject.toml", dst / "pyproject.toml")
    # the recipe's reward function, where its launch script names it (worker.reward.reward_function=examples/...):
    # the port maps it to reward._target_, read relative to the directory the harness runs in
    shutil.copytree(FIX / "examples", dst / "examples")
    return dst


def _run(args: list[str], root: Path, timeout: int):
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def _port_preset(root: Path, name: str) -> Path:
    out = root / "conf" / "experiment" / f"{name}.yaml"
    proc = _run(["-m", "harness.port", "easyr1", str(FIX / "easyr1_grpo_papo.yaml"), *SHRUNK,
                 "--harness", "model=tiny_vlm", "--harness", "data=synthetic", "--out", str(out)], root, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_ported_preset_plans_as_the_port_planned(tmp_path):
    root = _copy_repo(tmp_path / "repo")
    _port_preset(root, "papo_port")
    proc = _run(["-m", "harness", "experiment=papo_port", "mode=plan", f"output_root={tmp_path / 'out'}"], root, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    arm = plan["config"]["arm"]
    assert (arm["name"], arm["gamma"], arm["mask_ratio"], arm["init"]) == ("papo", 0.02, 0.6, "scratch")
    assert (arm["prompts_per_step"], arm["steps_per_generation"], arm["num_generations"]) == (4, 2, 4)
    assert plan["parent"] is None  # the source starts RL from its model: no SFT warm start
    assert (plan["config"]["reward"]["_target_"], plan["config"]["reward"]["convention"]) == (
        "examples/reward_function/math.py:compute_score", "easyr1")
    assert not (REPO / "conf" / "experiment" / "papo_port.yaml").exists()


@pytest.mark.slow  # ~55 s on the 2-core CPU: the port, then a debug=tiny papo run
def test_ported_papo_recipe_trains_with_debug_tiny(tmp_path):
    root = _copy_repo(tmp_path / "repo")
    _port_preset(root, "papo_port")
    out = tmp_path / "out"
    proc = _run(["-m", "harness", "experiment=papo_port", "debug=tiny", f"output_root={out}"], root, 600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir, = (out / "runs").iterdir()
    done = json.loads((run_dir / "completion.json").read_text())
    assert done["status"] == "completed" and done["arm"] == "papo" and done["optimizer_steps"] >= 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/kl_prcp" in r for r in rows)  # the perception term ran: gamma from kl_prcp_coef
    manifest = json.loads((run_dir / "run_manifest.json").read_text())
    assert manifest["plan"]["config"]["arm"]["gamma"] == 0.02
    assert manifest["identity"]["reward"]["functions"]["main"]["file"] == str(root / "examples/reward_function/math.py")
