"""The evi_po arm's knobs (conf/arm/evi_po.yaml extends /schema/arm/evi_po) and its plan-time rules.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from arms.grpo.config import GrpoArm, require_images
from harness.config.fields import PlacementKind, f
from harness.data.spec import relation_share


@dataclass
class EviPoArm(GrpoArm):
    """EVI-PO, this project's arm (docs/arms.md): GRPO plus direction and evidence terms over an item's views."""

    lambda_direction: float = f(0.1, "coefficient of the direction term L_dir; 0 disables it and its forwards", ge=0.0)
    tau: float = f(1.0, "temperature of the candidate softmax in L_dir", gt=0.0)
    lambda_evidence: float = f(0.02, "coefficient of the evidence term L_evi; 0 disables it and its forwards", ge=0.0)
    kappa: float = f(0.2, "upper clamp of k3(p, m_miss) in L_evi", gt=0.0)
    mu: float = f(1.0, "weight of the CONTROL invariance part inside L_evi, relative to the MISSING part (lambda_evidence scales the whole L_evi)", ge=0.0)
    eta1: float = f(0.0, "entropy coefficient of the policy branch", ge=0.0)
    evidence_on_correct_only: bool = f(False, "restrict L_evi to FULL rollouts with reward 1")

    @property
    def any_term(self) -> bool:
        return self.lambda_direction > 0 or self.lambda_evidence > 0 or self.eta1 > 0

    def reward_free_terms(self) -> list[str] | None:
        own = [t for t, on in (("the direction term (arm.lambda_direction)", self.lambda_direction > 0),
                               ("the evidence term (arm.lambda_evidence)", self.lambda_evidence > 0),
                               ("the entropy term (arm.eta1)", self.eta1 > 0)) if on]
        return super().reward_free_terms() + own

    def check(self, cfg, out) -> None:
        super().check(cfg, out)
        require_images(cfg, out)
        if self.lambda_direction == 0 and self.lambda_evidence == 0:
            out.warn("arm=evi_po with lambda_direction=0 and lambda_evidence=0 is plain GRPO")
        share = relation_share(cfg.data, "MISSING")
        if share is not None and share[0] * 3 > share[1]:
            out.warn(f"data: {share[0]} of the {share[1]} {cfg.data.train_split} views ({share[0] / share[1]:.0%}) "
                     "are MISSING: above a third, always abstaining is the degenerate optimum of evi_po's reward and "
                     "direction term; keep MISSING views at most a third of the training data, and watch "
                     "evi/FULL/abstain")
        p = cfg.placement
        sharded = p.kind is PlacementKind.fsdp or (p.kind is PlacementKind.deepspeed and p.zero_stage == 3)
        if sharded and (self.lambda_direction > 0 or self.lambda_evidence > 0):
            out.error("placement", p.name, "evi_po's extra forwards run on some ranks only (the direction term where "
                      "a view's first completion is, the evidence term where FULL rows are); with sharded parameters "
                      "every forward is a collective (all-gather), so the ranks would wait on each other forever",
                      "use placement=ddp or deepspeed (ZeRO-2), where parameters are replicated")
