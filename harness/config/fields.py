"""The building blocks of the typed configuration: the field helper `f`, the closed vocabularies and
the base class of every arm's config. No module of harness.config or arms is imported here, so an arm's
config (arms/<name>/config.py) and the root schema (harness.config.schema) can both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING


#: The runs derived from a run's command line (harness.plan): its SFT warm start and its planned teacher.
WARM_START, TEACHER = "warm_start", "teacher"
DERIVED = (WARM_START, TEACHER)


def f(default: Any = MISSING, help: str = "", *, semantic: bool = True, factory=None, derived: tuple = DERIVED,
      **bounds):
    """A schema field: default, one-line help, semantic flag, numeric bounds (ge/gt/le/lt), and `derived`: the runs
    derived from a command line (WARM_START, TEACHER) that take this field's value from it; () = this run's own
    (a pause, a push, the arm: harness.plan.inherited). A group's field says it for every key of the group."""
    meta = {"help": help, "semantic": semantic, "derived": tuple(derived), **bounds}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --- closed vocabularies (an Enum makes a wrong value a compose-time error that lists the valid ones)


class Mode(str, Enum):
    train = "train"
    plan = "plan"


class RunMode(str, Enum):
    normal = "normal"
    smoke = "smoke"


class Resume(str, Enum):
    auto = "auto"
    must = "must"
    never = "never"


class Tuning(str, Enum):
    full = "full"
    lora = "lora"


class Family(str, Enum):
    qwen2_vl = "qwen2_vl"
    qwen2_5_vl = "qwen2_5_vl"
    qwen3_vl = "qwen3_vl"
    qwen2 = "qwen2"  # text-only (tiny_lm)


class Source(str, Enum):
    tiny = "tiny"  # built locally from a config with seeded random weights
    pretrained = "pretrained"  # loaded from model.path or the local Hugging Face cache


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class RewardConvention(str, Enum):  # how a reward function is called (harness.rewards.conventions)
    trl = "trl"
    verl = "verl"
    easyr1 = "easyr1"


class RolloutBackend(str, Enum):
    hf = "hf"
    vllm = "vllm"


# sync: TRL samples each round in the trainer, from the weights it trains (on-policy); async: a sampler process
# samples rounds ahead of the trainer (harness.offpolicy). `async` is a keyword: the functional form names it.
RolloutMode = Enum("RolloutMode", [("sync", "sync"), ("async", "async")], type=str)


class VllmMode(str, Enum):
    colocate = "colocate"
    server = "server"


class ISCorrectionMode(str, Enum):  # TRL vllm_importance_sampling_mode
    token_truncate = "token_truncate"
    token_mask = "token_mask"
    sequence_truncate = "sequence_truncate"
    sequence_mask = "sequence_mask"


class PlacementKind(str, Enum):
    single = "single"
    ddp = "ddp"
    fsdp = "fsdp"
    deepspeed = "deepspeed"


class Scheduler(str, Enum):
    constant = "constant"
    constant_with_warmup = "constant_with_warmup"
    linear = "linear"
    cosine = "cosine"


# --- the base of every arm config (arms/<name>/config.py extends it)


@dataclass
class ArmConfig:
    name: str = f(MISSING, "arm name: arms/<name>/ (its registry entry) and conf/arm/<name>.yaml")
    learning_rate: float = f(1e-4, "AdamW peak learning rate", gt=0.0)
    lr_scheduler_type: Scheduler = f(Scheduler.constant, "learning-rate schedule")
    warmup_ratio: float = f(0.0, "fraction of planned steps spent warming up", ge=0.0, lt=1.0)
    weight_decay: float = f(0.0, "AdamW weight decay", ge=0.0)
    max_grad_norm: float = f(1.0, "gradient clipping norm", gt=0.0)
    gradient_accumulation_steps: int = f(1, "micro-batches per optimizer step; a memory knob only: it changes neither what is sampled nor the update", ge=1)

    def check(self, cfg, out) -> None:
        """The arm's own plan-time rules over the whole typed config `cfg`: out.error(field, value, why, fix),
        out.warn(text) (harness.config.checks.Findings). Subclasses extend it (super().check first)."""
        return None

    def teacher_arm(self) -> str | None:
        """An arm whose run of the same command line this run needs first (opd's arm.teacher=grpo): harness.plan
        plans it as the plan's `teacher`; None for arms without one."""
        return None

    def extra_identity(self, cfg) -> dict:
        """Parts of the plan's identity beyond config, data and model (after check passed), e.g. opd's teacher:
        {part: {field: value}}; a field ending in sha256 that changes refuses a resume (harness.rundir)."""
        return {}

    def reward_free_terms(self) -> list[str] | None:
        """The learning-signal monitor (harness.run.learning): the arm's active loss terms that move the policy without
        the reward's group advantages (papo's KL_prcp, evi_po's direction term), [] when the reward's advantages are
        the whole update (GRPO with beta 0), None when the monitor does not apply (an update that is not driven by
        the reward, e.g. opd's divergence to its teacher)."""
        return []
