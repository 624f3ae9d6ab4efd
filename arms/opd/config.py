"""The opd arm's knobs (conf/arm/opd.yaml extends /schema/arm/opd), its teacher and its plan-time rules. Torch-free.

The accounting is the RL arms' (kind rl): the student's sampled completions are what the token budget counts,
each gets a ledger and a trace row (the harness's reward of it is recorded, not trained on). A generation
round is one optimizer step's prompts, one completion each (TRL's DistillationTrainer samples one per prompt
and regenerates every optimizer step): harness.rounds reads num_generations = steps_per_generation =
num_iterations = 1 from the properties below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from arms.grpo.config import check_init, check_round
from harness.config.fields import ArmConfig, f

RUN_PREFIX = "run:"


@dataclass
class OpdArm(ArmConfig):
    init: str = f("sft", "student to start from: sft (the SFT run of the same model, data, seed), scratch, or a path")
    teacher: Optional[str] = f(None, "the teacher: a saved policy directory, or run:<run_name> (that run's final_policy under the same output_root); required")
    prompts_per_step: int = f(32, "prompts per optimizer step (all ranks), one sampled completion each, whatever the accumulation", ge=1)
    max_completion_length: int = f(16, "sampled tokens per completion at most", ge=1)
    temperature: float = f(0.7, "sampling temperature of the student's completions (not the divergence's: loss_temperature)", gt=0.0)
    top_p: float = f(1.0, "nucleus sampling mass", gt=0.0, le=1.0)
    top_k: int = f(0, "top-k sampling (0 = off)", ge=0)
    beta: float = f(1.0, "the divergence: 0 forward KL(teacher||student), 1 reverse KL(student||teacher), between: generalized JSD", ge=0.0, le=1.0)
    loss_temperature: float = f(1.0, "softmax temperature of both distributions in the divergence (TRL would use the sampling temperature)", gt=0.0)

    # the generation round (harness.rounds): fixed by TRL's DistillationTrainer
    num_generations = 1
    steps_per_generation = 1
    num_iterations = 1

    def check(self, cfg, out) -> None:
        check_init(self, out)
        check_round(self, cfg, out)
        if self.teacher is None:
            out.error("arm.teacher", None, "arm=opd distills from a teacher and none is set",
                      "set arm.teacher=run:<run_name> (a finished run under this output_root, e.g. a grpo run of "
                      "the default job) or arm.teacher=<a policy directory>")
        elif teacher_dir(self.teacher, cfg.output_root) is None:
            out.error("arm.teacher", self.teacher, teacher_problem(self.teacher, cfg.output_root),
                      "use run:<run_name> of a completed run (ls <output_root>/runs), or a directory with "
                      "config.json or adapter_config.json")
        if cfg.rollout.backend.value != "hf":
            out.error("rollout", cfg.rollout.name, "arm=opd samples with transformers here (TRL's distillation "
                      "trainer has no importance-sampling correction to map the vLLM rollout's knobs onto)",
                      "use rollout=hf")

    def extra_identity(self, cfg) -> dict:
        return {"teacher": teacher_identity(self.teacher, cfg.output_root)}


def _is_policy_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in ("config.json", "adapter_config.json"))


def teacher_dir(teacher: str, output_root: str) -> Path | None:
    """The teacher's policy directory, or None when there is none (teacher_problem says why)."""
    if teacher.startswith(RUN_PREFIX):
        run = Path(output_root) / "runs" / teacher[len(RUN_PREFIX):]
        if not (run / "completion.json").is_file() or not _is_policy_dir(run / "final_policy"):
            return None
        return (run / "final_policy").resolve()
    path = Path(teacher)
    return path.resolve() if _is_policy_dir(path) else None


def teacher_problem(teacher: str, output_root: str) -> str:
    if teacher.startswith(RUN_PREFIX):
        run = Path(output_root) / "runs" / teacher[len(RUN_PREFIX):]
        if not run.is_dir():
            return f"names no run: {run} does not exist"
        return f"names a run that has not completed ({run / 'completion.json'} is missing): run it first"
    return "is neither run:<run_name> nor a policy directory (config.json or adapter_config.json in it)"


def teacher_identity(teacher: str, output_root: str) -> dict:
    """What the plan records of the teacher (semantic: a changed teacher refuses a resume): its directory, the
    digest of its weight files, and for run:<name> that run's semantic identity and final eval."""
    from harness.policy import weights_digest_of_files

    path = teacher_dir(teacher, output_root)
    out = {"spec": teacher, "path": str(path), "weights_sha256": weights_digest_of_files(path)}
    if teacher.startswith(RUN_PREFIX):
        run = path.parent
        manifest = json.loads((run / "run_manifest.json").read_text())
        completion = json.loads((run / "completion.json").read_text())
        after = completion.get("eval_after") or {}
        out.update(run_name=run.name, arm=manifest["plan"]["config"]["arm"]["name"],
                   semantic_sha256=manifest["plan"]["identity"]["semantic_sha256"],
                   eval_accuracy=after.get("accuracy"), eval_split=after.get("split"))
    return out
