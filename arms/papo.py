"""papo: Perception-Aware Policy Optimization (Wang et al. 2025, arXiv 2507.06448), GRPO variant.

Objective (maximised), on completions o_i sampled from the rollout policy for (prompt q, image I):

    J = J_GRPO + gamma * KL_prcp - eta1 * H_orig - eta2 * H_mask
    KL_prcp = masked_mean( min(k3(p, m), kappa) )           the implicit perception loss
    p_it = log pi_theta(o_it | q, I, o_i,<t)                  with gradient
    m_it = log pi(o_it | q, mask(I), o_i,<t)                  the SAME sampled tokens, masked image

so the loss added to TRL's GRPO loss of a micro-batch is

    -gamma * masked_mean(min(k3(p, m), kappa)) + eta1 * masked_mean(-p) + eta2 * masked_mean(-m)

k3(p, m) = exp(d) - d - 1 with d = clamp(m - p, -20, 20), clamped to at most 10: the official
code's `low_var_kl`, the low-variance estimator of KL(pi_theta || pi_masked) on rollout samples.
Maximising it makes the answer depend on the pixels: a policy that ignores the image has
KL_prcp = 0. mask(I) blacks out each patch_size x patch_size cell of the PIL image with
probability mask_ratio (the paper's random patch masking, 0.6 at patch 14).

Defaults: the paper's PAPO-G (gamma 0.02, mask_ratio 0.6, kappa 10, eta1 = eta2 = 0); its
high-gamma variant pairs gamma with double entropy eta1 = eta2 = 0.05. gamma >= 0.04 collapsed in
the paper ("KL_prcp hacking"): the planner warns above 0.02 (harness/checks.py).

Deviations from the paper / official code, all deliberate:
- Masking is done on the PIL image before the processor, never on processed pixel tensors (TRL's
  removed PAPOTrainer masked the processed tensors, which is a no-op for Qwen's patch layout).
  The image size is unchanged, so the number of vision tokens and every prompt id stay the same.
- The mask is seeded by (run seed, global step of the generation, prompt slot within the generation
  round (harness.rounds), image index), not drawn from a global RNG: a resumed run masks
  identically, and masking never consumes the RNG streams that sampling and the resume audit
  depend on. All G completions of one prompt see
  the same masked image.
- m is computed once per generation batch with no gradient, next to TRL's old log-probs (as the
  official code does); `recompute_masked_with_grad` re-scores inside the loss with gradient
  instead (one more forward + backward per micro-batch). With m detached, the eta2 term carries
  no gradient; it is kept for fidelity with the official code.
- Normalization: for TRL's token-level loss types (dapo, cispo, vespo) the extra term is a token
  mean over the accumulation window, with TRL's own normalizer; for the others (grpo, bnpo,
  dr_grpo, sapo, luspo) it is the micro-batch token mean divided by the accumulation steps (as
  TRL's entropy bonus does), not their sequence- or length-normalized policy aggregation.

Logged: loss/kl_prcp (the clamped KL_prcp), loss/papo (the term added), papo/entropy_orig
(-mean p), papo/entropy_masked (-mean m), papo/kl_clip_ratio (tokens with k3 >= kappa); TRL
logs the importance-ratio clip ratios (clip_ratio/high_mean, ...) as for grpo.

This module's math (k3, masked_mean, papo_terms, mask_image, mask_seed) imports torch and numpy
only; the trainer is built lazily by `build_trainer` over arms.grpo's shared TRL glue.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from arms.common import BuildContext

K3_CLAMP = 10.0  # the official low_var_kl clamps the estimate to [-10, 10]
LOG_RATIO_CLAMP = 20.0

# --- the pure terms


def k3(logp: torch.Tensor, other_logp: torch.Tensor) -> torch.Tensor:
    """Low-variance KL estimate exp(d) - d - 1, d = clamp(other - logp, +-20), clamped to <= 10. (B, T) -> (B, T)."""
    d = torch.clamp(other_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(d) - d - 1.0, max=K3_CLAMP)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(mask * x) / sum(mask) over every element (token mode); 0 when the mask is empty."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def real_only(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """Replace padding positions by 0 so they are inert: their gradient is exactly zero even when the
    padded values are inf or NaN (a mask multiply alone would give 0 * nan = nan)."""
    keep = mask > 0
    return [torch.where(keep, t, torch.zeros_like(t)) for t in tensors]


def papo_terms(logp: torch.Tensor, masked_logp: torch.Tensor, mask: torch.Tensor, *, gamma: float,
               kappa: float = 10.0, eta1: float = 0.0, eta2: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The PAPO term added to the GRPO loss of one micro-batch, and its statistics.

    logp, masked_logp, mask: (B, T). Returns
        -gamma * masked_mean(min(k3(logp, masked_logp), kappa)) + eta1 * masked_mean(-logp)
        + eta2 * masked_mean(-masked_logp)
    with masked_mean over all real tokens of the micro-batch (token mode), and detached stats.
    """
    mask = mask.to(logp.dtype)
    p, m = real_only(mask, logp, masked_logp)  # (B, T) each
    kl = k3(p, m)  # (B, T)
    kl_prcp = masked_mean(torch.clamp(kl, max=kappa), mask)
    h_orig = masked_mean(-p, mask)  # sampled-token entropy estimate of the original branch
    h_mask = masked_mean(-m, mask)
    loss = -gamma * kl_prcp + eta1 * h_orig + eta2 * h_mask
    stats = {
        "kl_prcp": kl_prcp.detach(),
        "entropy_orig": h_orig.detach(),
        "entropy_masked": h_mask.detach(),
        "kl_clip_ratio": masked_mean((kl >= kappa).to(mask.dtype), mask).detach(),
        "tokens": mask.sum().detach(),
    }
    return loss, stats


def mask_seed(run_seed: int, step: int, slot: int, image_index: int = 0) -> int:
    """The seed of one prompt's mask: (run seed, global step of the generation, prompt slot, image)."""
    digest = hashlib.sha256(f"papo-mask:{run_seed}:{step}:{slot}:{image_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def mask_image(image, *, patch_size: int, ratio: float, seed: int):
    """Black out each patch_size x patch_size cell of a PIL image with probability `ratio`.

    Same size and mode as the input (the input is not modified); cells at the right and bottom edge
    may be partial. Deterministic in `seed` (numpy's PCG64, independent of every global RNG).
    """
    from PIL import Image

    if patch_size < 1 or not 0.0 <= ratio <= 1.0:
        raise ValueError(f"mask_image needs patch_size >= 1 and 0 <= ratio <= 1, got {patch_size}, {ratio}")
    src = image if image.mode in ("RGB", "RGBA", "L", "I", "F") else image.convert("RGB")
    arr = np.array(src)  # (H, W) or (H, W, C), a copy
    h, w = arr.shape[:2]
    gh, gw = -(-h // patch_size), -(-w // patch_size)
    cells = np.random.default_rng(seed).random((gh, gw)) < ratio  # (gh, gw)
    pixels = np.repeat(np.repeat(cells, patch_size, axis=0), patch_size, axis=1)[:h, :w]  # (H, W)
    if arr.ndim == 3 and arr.shape[2] == 4:
        arr[pixels, :3] = 0  # keep alpha: a masked cell is black, not transparent
    else:
        arr[pixels] = 0
    return Image.fromarray(arr, mode=src.mode) if src.mode in ("I", "F") else Image.fromarray(arr)


# --- the knobs


@dataclass(frozen=True)
class PapoKnobs:
    """The arm's PAPO fields (harness.schema.PapoArm) and the run seed the masks derive from."""

    gamma: float = 0.02
    mask_ratio: float = 0.6
    patch_size: int | None = None  # None: the processor's patch size
    kappa: float = 10.0
    eta1: float = 0.0
    eta2: float = 0.0
    recompute_masked_with_grad: bool = False
    run_seed: int = 0

    @classmethod
    def from_arm(cls, arm: dict, run_seed: int) -> "PapoKnobs":
        return cls(gamma=arm["gamma"], mask_ratio=arm["mask_ratio"], patch_size=arm["patch_size"],
                   kappa=arm["kappa"], eta1=arm["eta1"], eta2=arm["eta2"],
                   recompute_masked_with_grad=arm["recompute_masked_with_grad"], run_seed=run_seed)

    @property
    def needs_masked(self) -> bool:
        """The masked branch is scored only when a term reads it (gamma or eta2 non-zero)."""
        return self.gamma > 0 or self.eta2 > 0

    @property
    def any_term(self) -> bool:
        return self.needs_masked or self.eta1 > 0


# --- the trainer: TRL's GRPO loss unchanged, plus the PAPO term (arms.grpo.extra_terms_trainer_base)


@functools.cache
def trainer_cls():
    from arms.grpo import extra_terms_trainer_base, row_images

    Base = extra_terms_trainer_base()

    class PapoTrainer(Base):
        """GRPOTrainer + the PAPO term; see the module docstring."""

        def __init__(self, *args, knobs: PapoKnobs, **kwargs):
            super().__init__(*args, **kwargs)
            self.knobs = knobs
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
                                              seed=mask_seed(k.run_seed, step, slot, j))
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

    return PapoTrainer


def build_trainer(ctx: BuildContext):
    from arms.grpo import build_trainer as build_grpo

    c = ctx.plan.config
    knobs = PapoKnobs.from_arm(c["arm"], run_seed=c["seed"])
    return build_grpo(ctx, trainer_cls=functools.partial(trainer_cls(), knobs=knobs))
