"""sft: TRL's SFTTrainer, completion-only loss and the loss-token cap (docs/arms.md sft); its final policy
initializes the RL arms (arm.init=sft)."""

from arms.common import ArmSpec
from arms.sft.config import SftArm

ARM = ArmSpec("sft", kind="sft", config=SftArm, color="tab:gray",
              summary="TRL SFTTrainer, completion-only loss, loss-token cap")
