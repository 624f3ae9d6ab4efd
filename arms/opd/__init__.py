"""opd: on-policy distillation over TRL's DistillationTrainer (docs/arms.md opd): the student samples, a teacher
(a saved policy) scores the visited positions, the student minimizes the per-token divergence (beta=1: reverse KL)."""

from arms.common import ArmSpec
from arms.opd.config import OpdArm

ARM = ArmSpec("opd", kind="rl", config=OpdArm, color="tab:purple",
              summary="on-policy distillation from a teacher policy (TRL DistillationTrainer, reverse KL)")
