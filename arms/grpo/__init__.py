"""grpo: TRL's GRPOTrainer with the harness reward function (docs/arms.md grpo); the base of every RL arm."""

from arms.common import ArmSpec
from arms.grpo.config import GrpoArm

ARM = ArmSpec("grpo", kind="rl", config=GrpoArm, color="tab:blue",
              summary="TRL GRPOTrainer with the harness reward function")
