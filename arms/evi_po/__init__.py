"""evi_po: GRPO + direction and evidence terms over an item's views, this project's arm (docs/arms.md evi_po)."""

from arms.common import ArmSpec
from arms.evi_po.config import EviPoArm

ARM = ArmSpec("evi_po", kind="rl", config=EviPoArm, color="tab:green",
              summary="GRPO + direction and evidence terms over an item's views (docs/arms.md)")
