"""evi_po: evidence policy optimization, this project's arm (docs/arms.md evi_po).

A base question q has views v (one dataset row each) with image I_v, relation r_v and target y_v:
FULL and CONTROL -> a*, MISSING -> the abstention, SUBSTITUTE -> a_sub(v). Candidates
C_q = {a*, abstention} + {a_sub(v)}. Rows carry their linkage (harness.data.trainsets `views` column:
candidates, the target's index, and on FULL rows the MISSING and CONTROL image paths), so no
cross-row sampler is needed.

    loss = loss_grpo + lambda_direction * L_dir + lambda_evidence * L_evi (+ eta1 * masked_mean(-p))

(0) RL term: TRL's GRPO, unchanged, with the harness's relation-aware reward 1[parse(o) == y_v];
    one row per view, so the G completions of a group share one view (groups per view, never across).
(1) Direction: s(c | v) = mean_t log pi_theta(c_t | x_v, c_<t), x_v = chat(q, I_v) + the answer
    prefix, scored by the untempered policy (temperature 1, whatever arm.temperature samples at);
    L_dir = mean over views of -log softmax_c(s(c|v) / tau)[y_v]. One teacher-forced forward per
    view with all candidates batched, no generation, with gradient.
(2) Evidence, on FULL-view rollouts: L_evi = -masked_mean(min(k3(p, m_miss), kappa))
    + mu * masked_mean(k3(p, m_ctrl)) (mu weighs the CONTROL part inside L_evi, default 1; the whole
    L_evi is scaled by lambda_evidence), m_* = no-grad re-scoring of the same sampled tokens under the
    group's MISSING / CONTROL image (once per generation batch). Option: only rollouts with reward 1.

Choices made here (docs/arms.md leaves them open):
- The answer prefix and the candidate tokens are found in token space: each candidate is rendered
  as the completion the model writes (harness.rewards.answers.format_answer) and tokenized; the tokens all
  candidates share at the start are the answer prefix (appended to x_v, not scored), the tokens they
  share at the end (the closing tag) are not scored either, so s(c|v) is over the candidate's own
  tokens (one token each on the synthetic set with the tiny tokenizer: then s is that token's log-prob).
- The direction term is computed once per view and generation batch, on the row of the view's first
  completion (its "owner"), and normalized as a mean over the views of the accumulation window.
- A MISSING / CONTROL image of another size than the FULL image is resized to it (the prompt ids
  were built for the FULL image's grid).
- Token terms (evidence, eta1) are normalized like TRL's loss (see arms.papo's docstring).
Either lambda at 0 disables its term and its forwards (and image loading / tokenization).

Logged per relation R (FULL, CONTROL, MISSING, SUBSTITUTE), from the sampled rollouts:
evi/R/accuracy, evi/R/abstain; from the direction forward: evi/R/dir_acc; on FULL rollouts:
evi/FULL/kl_miss, evi/FULL/kl_ctrl (k3 means, before the kappa clamp); and loss/direction,
loss/evidence. Always-abstain is the degenerate optimum: watch evi/FULL/abstain.

Multi-process: ranks run different numbers of extra forwards (a rank may hold no FULL row); every
collective here (gathers of counts, metric reduces) is called on every rank in the same order.
"""

from __future__ import annotations

import torch

from arms.papo.terms import k3, masked_mean, real_only
from harness.rewards.answers import candidate_tokens  # noqa: F401  (the answer prefix and scored tokens)

# --- the pure terms


def direction_loss(scores: torch.Tensor, target_index: torch.Tensor, *, tau: float = 1.0,
                   candidate_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Mean over views of the cross-entropy of softmax(scores / tau) at the target.

    scores: (V, C) candidate scores per view; target_index: (V,) long; candidate_mask: optional (V, C)
    bool, False for padded candidates (excluded from the softmax, zero gradient). V = 0 gives 0.
    """
    logits = scores / tau  # (V, C)
    if candidate_mask is not None:
        logits = logits.masked_fill(~candidate_mask.bool(), float("-inf"))
    logq = torch.log_softmax(logits, dim=-1)  # (V, C)
    nll = -logq.gather(1, target_index.long().unsqueeze(1)).squeeze(1)  # (V,)
    loss = nll.mean() if nll.numel() else scores.sum() * 0.0
    correct = (logits.argmax(dim=-1) == target_index).float()  # (V,)
    stats = {"nll": nll.detach(), "correct": correct.detach(),
             "target_prob": logq.detach().gather(1, target_index.long().unsqueeze(1)).squeeze(1).exp()}
    return loss, stats


def evidence_loss(logp: torch.Tensor, m_miss: torch.Tensor, mask: torch.Tensor, *, kappa: float = 0.2,
                  m_ctrl: torch.Tensor | None = None, mu: float = 0.0) -> tuple[torch.Tensor, dict]:
    """-masked_mean(min(k3(logp, m_miss), kappa)) + mu * masked_mean(k3(logp, m_ctrl)) (second part only
    when m_ctrl is given). logp, m_miss, m_ctrl, mask: (B, T); masked means over all real tokens."""
    mask = mask.to(logp.dtype)
    p, mm = real_only(mask, logp, m_miss)  # (B, T)
    kl_miss = k3(p, mm)  # (B, T)
    loss = -masked_mean(torch.clamp(kl_miss, max=kappa), mask)
    stats = {"kl_miss": masked_mean(kl_miss, mask).detach(),
             "kl_miss_clip_ratio": masked_mean((kl_miss >= kappa).to(mask.dtype), mask).detach(),
             "tokens": mask.sum().detach()}
    if m_ctrl is not None:
        (mc,) = real_only(mask, m_ctrl)
        kl_ctrl = masked_mean(k3(p, mc), mask)
        loss = loss + mu * kl_ctrl
        stats["kl_ctrl"] = kl_ctrl.detach()
    return loss, stats
