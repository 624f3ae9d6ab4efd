"""Which fields a derived run (the SFT warm start, the planned teacher) takes from its child's command line is
declared on the field (`derived=` of harness.config.fields.f), not in key lists kept by hand (issue 38): a new field
marked child-only stays with the child, a new field left unmarked reaches both, in a temporary copy of the
repository where the schema gains the two fields."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from harness.plan import inherited
from tests.conftest import REPO

COPIED = ("harness", "arms", "conf", "sweeps", "accelerate")
ANCHOR = '''    hang_timeout_s: Optional[float] = f('''
FIELDS = '''    probe_child_only: int = f(0, "a test's field: this run's own", derived=())
    probe_shared: int = f(0, "a test's field: every derived run takes it")
'''


def _repo_with_fields(dst: Path) -> Path:
    for name in COPIED:
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    schema = dst / "harness" / "config" / "schema.py"
    text = schema.read_text()
    assert text.count(ANCHOR) == 1  # TrainConfig's last field: the two new ones go before it
    schema.write_text(text.replace(ANCHOR, FIELDS + ANCHOR))
    return dst


def _plan(repo: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "harness", "mode=plan", *args], cwd=repo, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_a_child_only_field_reaches_neither_the_warm_start_nor_the_teacher(tmp_path):
    repo = _repo_with_fields(tmp_path / "repo")
    args = [f"output_root={tmp_path / 'out'}", "debug=tiny", "train.probe_child_only=7", "train.probe_shared=5"]
    grpo = _plan(repo, *args)  # arm.init=sft: its warm start is derived
    opd = _plan(repo, "arm=opd", *args)  # arm.teacher=grpo: its teacher (and the teacher's warm start) are derived
    for child in (grpo, opd):
        assert (child["config"]["train"]["probe_child_only"], child["config"]["train"]["probe_shared"]) == (7, 5)
    derived = [grpo["parent"], opd["teacher"], opd["teacher"]["parent"]]
    for plan in derived:
        assert (plan["config"]["train"]["probe_child_only"], plan["config"]["train"]["probe_shared"]) == (0, 5)


def test_the_schema_flags_keep_what_the_hand_kept_lists_said():
    """The warm start drops the arm, the rollout, the step caps and the checkpoint cadence, and what acts on this run
    only; the teacher drops the arm and what acts on this run only."""
    warm = {k for k in ("arm", "arm.gamma", "rollout", "rollout.backend", "mode", "run_mode", "budget.max_steps",
                        "budget.stop_after_steps", "train.save_steps", "train.push_to_hub", "train.hub_model_id")}
    teacher = {"arm", "arm.gamma", "mode", "run_mode", "budget.stop_after_steps", "train.push_to_hub",
               "train.hub_model_id"}
    kept = ("model", "model.path", "data.n_base", "seed", "+reward.kwargs.x", "hydra.run.dir", "debug", "experiment",
            "budget.max_completion_tokens", "budget.sft_warm_start_steps", "train.eval_after", "logger.wandb")
    for key in [*warm, *kept]:
        assert inherited(key, "warm_start") == (key not in warm), key
    for key in [*warm, *kept]:
        assert inherited(key, "teacher") == (key not in teacher), key
