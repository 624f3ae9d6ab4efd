"""Adding an arm touches only arms/<name>/ and conf/arm/<name>.yaml: a throwaway arm is written into a copy
of the repository and planned, trained and verified through the registry, with nothing in harness/ edited."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

COPIED = ("harness", "arms", "conf", "sweeps", "accelerate")

ARM_FILES = {
    "arms/scaled_grpo/__init__.py": '''
        from arms.common import ArmSpec
        from arms.scaled_grpo.config import ScaledGrpoArm

        ARM = ArmSpec("scaled_grpo", kind="rl", config=ScaledGrpoArm, summary="GRPO with a scaled loss (a test arm)")
    ''',
    "arms/scaled_grpo/config.py": '''
        from dataclasses import dataclass

        from arms.grpo.config import GrpoArm
        from harness.config.fields import f


        @dataclass
        class ScaledGrpoArm(GrpoArm):
            loss_scale: float = f(1.0, "multiplies GRPO's loss", gt=0.0)

            def check(self, cfg, out) -> None:
                super().check(cfg, out)
                if self.loss_scale > 10:
                    out.error("arm.loss_scale", self.loss_scale, "is above 10", "use arm.loss_scale <= 10")
    ''',
    "arms/scaled_grpo/trainer.py": '''
        from trl import GRPOTrainer

        from arms.grpo.trainer import build_trainer as build_grpo


        class ScaledTrainer(GRPOTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                self._metrics["train"]["scaled/loss_scale"].append(self.loss_scale)
                return loss * self.loss_scale


        def build_trainer(ctx):
            trainer = build_grpo(ctx, trainer_cls=ScaledTrainer)
            trainer.loss_scale = ctx.plan.config["arm"]["loss_scale"]
            return trainer
    ''',
    "conf/arm/scaled_grpo.yaml": '''
        defaults:
          - /schema/arm/scaled_grpo@_here_
          - _self_
        name: scaled_grpo
        learning_rate: 1.0e-4
    ''',
}


def _copy_with_arm(dst: Path) -> Path:
    for name in COPIED:
        shutil.copytree(REPO / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in ARM_FILES.items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_text(textwrap.dedent(text).lstrip())
    return dst


def _harness(repo: Path, *args: str, module: str = "harness", timeout: float = 240):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=repo, capture_output=True, text=True,
                          timeout=timeout)


def test_a_throwaway_arm_trains_through_the_registry(tmp_path):
    repo = _copy_with_arm(tmp_path / "repo")
    harness_files = {p.relative_to(repo): p.read_bytes() for p in (repo / "harness").rglob("*.py")}
    out = tmp_path / "out"
    common = [f"output_root={out}", "arm=scaled_grpo", "debug=tiny", "arm.init=scratch", "budget.max_steps=2",
              "train.save_steps=2", "train.eval_before=false", "train.eval_after=false"]

    refused = _harness(repo, *common, "arm.loss_scale=50", "mode=plan")  # the arm's own plan-time rule
    assert refused.returncode == 2 and "arm.loss_scale" in refused.stderr and "above 10" in refused.stderr
    planned = _harness(repo, *common, "arm.loss_scale=0.5", "mode=plan")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["kind"] == "rl" and plan["budget"]["kind"] == "completion_tokens"
    assert plan["config"]["arm"]["loss_scale"] == 0.5 and plan["run_name"].startswith("scaled_grpo-")
    assert "loss_scale" in _harness(repo, "--help", timeout=60).stdout  # the knob is documented by its field

    proc = _harness(repo, *common, "arm.loss_scale=0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(plan["run_dir"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "scaled/loss_scale" in r] == [1, 2]  # the arm's trainer trained
    assert all(r["scaled/loss_scale"] == 0.5 for r in rows if "scaled/loss_scale" in r)
    ledger = (run / "ledgers" / "rank-0.jsonl").read_text().splitlines()
    assert len(ledger) == json.loads((run / "completion.json").read_text())["realized_completion_count"] > 0
    verified = _harness(repo, str(run), module="harness.verify", timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert {p.relative_to(repo): p.read_bytes() for p in (repo / "harness").rglob("*.py")} == harness_files
