"""papo's trainer: TRL's GRPO loss unchanged, plus the PAPO term (arms.papo.terms; docs/arms.md papo).
Imports torch and trl: loaded by the registry inside the process that trains."""

from __future__ import annotations

import functools

import torch

from arms.common import BuildContext
from arms.grpo.trainer import build_trainer as build_grpo
from arms.papo.config import PapoArm
from arms.papo.terms import mask_image, mask_seed, papo_terms
from arms.trl_hooks import ExtraTermsGRPOTrainer, row_images


class PapoTrainer(ExtraTermsGRPOTrainer):
    """GRPOTrainer + the PAPO term; see the module docstring."""

    def __init__(self, *args, knobs: PapoArm, run_seed: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.knobs, self.run_seed = knobs, run_seed
        self.extra_loss_enabled = knobs.any_term
        proc = getattr(self.processing_class, "image_processor", None)
        self.mask_patch = knobs.patch_size or getattr(proc, "patch_size", None)
        if knobs.needs_masked and not self.mask_patch:
            raise ValueError("arm=papo needs a vision processor with a patch_size (or set arm.patch_size): "
                             f"{type(self.processing_class).__name__} has none")

    # -- once per generation batch, no gradient: the masked images and (by default) m

    def score_generation(self, inputs: list[dict], batch: dict) -> dict:
        k = self.knobs
        if not k.needs_masked:
            return {}
        step, rank = self.state.global_step, self.accelerator.process_index  # step: the round's first step
        cache: dict[int, list] = {}  # slot -> masked images: the G copies of a prompt share one mask
        masked = []
        for i, x in enumerate(inputs):
            slot, _ = self.generation_round.slot(rank, i)  # unique over the round's prompts, all ranks
            if slot not in cache:
                cache[slot] = [mask_image(img, patch_size=self.mask_patch, ratio=k.mask_ratio,
                                          seed=mask_seed(self.run_seed, step, slot, j))
                               for j, img in enumerate(row_images(x))]
            masked.append(cache[slot])
        pixel_values = self.pixels_like(batch, masked)  # (sum of patches, D)
        if k.recompute_masked_with_grad:  # one tensor per row, so TRL's shuffle and split keep rows aligned
            return {"papo_masked_pixel_values": self.pixels_per_row(batch, pixel_values)}
        with torch.no_grad():
            m = self.score_completions(self.model, batch, pixel_values=pixel_values)  # (B, T)
        return {"papo_masked_logps": m}

    # -- per micro-batch: the term, on the policy log-probs of TRL's own forward

    def extra_loss(self, model, inputs: dict, logp: torch.Tensor):
        k = self.knobs
        mask = self.loss_mask(inputs)  # (B, T)
        if not k.needs_masked:
            m = torch.zeros_like(logp)  # read only by zero-coefficient terms
        elif k.recompute_masked_with_grad:
            m = self.score_completions(model, inputs, pixel_values=torch.cat(inputs["papo_masked_pixel_values"]))
        else:
            m = inputs["papo_masked_logps"]
        term, stats = papo_terms(logp, m, mask, gamma=k.gamma, kappa=k.kappa, eta1=k.eta1, eta2=k.eta2)
        term = term * self.token_term_scale(mask, inputs["num_items_in_batch"])
        n = stats["tokens"]
        logged = {"loss/papo": (term.detach() * n, n)}
        if k.needs_masked:
            logged.update({
                "loss/kl_prcp": (stats["kl_prcp"] * n, n),
                "papo/entropy_orig": (stats["entropy_orig"] * n, n),
                "papo/entropy_masked": (stats["entropy_masked"] * n, n),
                "papo/kl_clip_ratio": (stats["kl_clip_ratio"] * n, n),
            })
        self.log_sums(logged)
        return term


def build_trainer(ctx: BuildContext):
    c = ctx.plan.cfg
    return build_grpo(ctx, trainer_cls=functools.partial(PapoTrainer, knobs=c.arm, run_seed=c.seed))
