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
the paper ("KL_prcp hacking"): the planner warns above 0.02 (harness/config/checks.py).

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
only; the trainer (arms.papo.trainer) is built over the shared TRL glue (arms.trl_hooks).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

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
