"""The papo arm's knobs (conf/arm/papo.yaml extends /schema/arm/papo) and its plan-time rules. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from arms.grpo.config import GrpoArm, require_images
from harness.config.fields import f

GAMMA_SAFE = 0.02  # docs/arms.md: gamma >= 0.04 collapsed in the paper ("KL_prcp hacking")


@dataclass
class PapoArm(GrpoArm):
    """PAPO (Wang et al. 2025, arXiv 2507.06448); defaults are the paper's PAPO-G."""

    gamma: float = f(0.02, "coefficient of the implicit perception loss KL_prcp; >= 0.04 collapsed in the paper", ge=0.0)
    mask_ratio: float = f(0.6, "probability that a patch cell of the image is blacked out", gt=0.0, lt=1.0)
    patch_size: Optional[int] = f(None, "masking cell size in pixels; null = the processor's patch size", ge=1)
    kappa: float = f(10.0, "upper clamp of the per-token k3 KL estimate", gt=0.0)
    eta1: float = f(0.0, "entropy coefficient of the original branch (double entropy regularization)", ge=0.0)
    eta2: float = f(0.0, "entropy coefficient of the masked branch; no gradient unless recompute_masked_with_grad", ge=0.0)
    recompute_masked_with_grad: bool = f(False, "re-score the masked image inside the loss with gradient (off: once per generation batch, no grad)")

    @property
    def needs_masked(self) -> bool:
        """The masked branch is scored only when a term reads it (gamma or eta2 non-zero)."""
        return self.gamma > 0 or self.eta2 > 0

    @property
    def any_term(self) -> bool:
        return self.needs_masked or self.eta1 > 0

    def reward_free_terms(self) -> list[str] | None:
        own = [t for t, on in (("KL_prcp (arm.gamma)", self.gamma > 0), ("the entropy term (arm.eta1)", self.eta1 > 0),
                               ("the masked entropy term (arm.eta2)", self.eta2 > 0 and self.recompute_masked_with_grad))
               if on]
        return super().reward_free_terms() + own

    def check(self, cfg, out) -> None:
        super().check(cfg, out)
        require_images(cfg, out)
        if self.gamma > GAMMA_SAFE:
            out.warn(f"arm.gamma={self.gamma} is above {GAMMA_SAFE}: gamma >= 0.04 collapsed in the PAPO paper "
                     "(KL_prcp hacking); consider eta1=eta2=0.05 (double entropy) with it")
