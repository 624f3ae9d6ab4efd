"""The opd arm's knobs (conf/arm/opd.yaml extends /schema/arm/opd), its teacher and its plan-time rules. Torch-free.

The accounting is the RL arms' (kind rl): the student's sampled completions are what the token budget counts,
each gets a ledger and a trace row (the harness's reward of it is recorded, not trained on). A generation
round is one optimizer step's prompts, one completion each (TRL's DistillationTrainer samples one per prompt
and regenerates every optimizer step): harness.rounds reads num_generations = steps_per_generation =
num_iterations = 1 from the properties below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from arms.grpo.config import check_init, check_round
from harness.config.fields import ArmConfig, f

RUN_PREFIX = "run:"


@dataclass
class OpdArm(ArmConfig):
    init: str = f("sft", "student to start from: sft (the SFT run of the same model, data, seed), scratch, or a path")
    teacher: Optional[str] = f("grpo", "the teacher: an arm (grpo, sft, papo, evi_po: that arm's run of the same model, data, budget and seed, planned and run first), run:<run_name> (that run's final_policy under the same output_root), or a saved policy directory")
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

    def teacher_arm(self) -> str | None:
        """The arm whose run of the same command line is this run's teacher (harness.plan plans it), or None."""
        from arms import registry

        return self.teacher if self.teacher in registry() and self.teacher != self.name else None

    def reward_free_terms(self) -> list[str] | None:
        return None  # the divergence to the teacher drives the update: the reward only scores (the monitor is off)

    def check(self, cfg, out) -> None:
        from arms import registry

        check_init(self, out)
        check_round(self, cfg, out)
        if self.teacher is None:
            out.error("arm.teacher", None, "arm=opd distills from a teacher and none is set",
                      "set arm.teacher=grpo (the grpo run of this command line, run first), run:<run_name> (a "
                      "finished run under this output_root) or a policy directory")
        elif self.teacher == self.name:
            out.error("arm.teacher", self.teacher, "an opd run cannot be planned as its own teacher",
                      f"use another arm ({', '.join(a for a in registry() if a != self.name)}), run:<run_name> or a "
                      "policy directory")
        elif self.teacher_arm() is not None:
            pass  # harness.plan plans it (its own config is checked there)
        elif teacher_dir(self.teacher, cfg.output_root) is None:
            out.error("arm.teacher", self.teacher, teacher_problem(self.teacher, cfg.output_root),
                      "use run:<run_name> of a completed run (ls <output_root>/runs), or a directory with "
                      "config.json or adapter_config.json")
        if cfg.rollout.backend.value != "hf":
            out.error("rollout", cfg.rollout.name, "arm=opd samples with transformers here (TRL's distillation "
                      "trainer has no importance-sampling correction to map the vLLM rollout's knobs onto)",
                      "use rollout=hf")

    def extra_identity(self, cfg) -> dict:
        if self.teacher_arm() is not None:  # recorded from the teacher's plan (harness.plan.teacher_plan)
            return {}
        return {"teacher": teacher_identity(self.teacher, cfg.output_root)}


def _is_policy_dir(path: Path) -> bool:
    from harness.accounting.weights import is_policy_dir

    return is_policy_dir(path)


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
    from arms import registry

    return (f"is neither an arm ({', '.join(registry())}), nor run:<run_name>, nor a policy directory (config.json or "
            "adapter_config.json in it)")


def teacher_identity(teacher: str, output_root: str) -> dict:
    """What the plan records of a teacher given as run:<name> or a directory (semantic: a changed teacher refuses
    a resume): its directory, the digest of its weight files, and for run:<name> that run's semantic identity
    and final eval. A planned teacher (arm.teacher=<arm>) is recorded by harness.plan from its plan."""
    from harness.accounting.weights import final_policy_identity, weights_digest_of_files

    path = teacher_dir(teacher, output_root)
    if teacher.startswith(RUN_PREFIX):
        return {"spec": teacher, **final_policy_identity(path.parent)}
    return {"spec": teacher, "path": str(path), "weights_sha256": weights_digest_of_files(path)}
