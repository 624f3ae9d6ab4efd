"""papo: GRPO + the implicit perception loss on masked images (Wang et al. 2025, arXiv 2507.06448;
docs/arms.md papo)."""

from arms.common import ArmSpec
from arms.papo.config import PapoArm

ARM = ArmSpec("papo", kind="rl", config=PapoArm, color="tab:orange",
              summary="GRPO + implicit perception loss on masked images (arXiv 2507.06448)")
