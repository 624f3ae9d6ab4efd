"""evi_po: evidence policy optimization, this project's arm (ARMS.md evi_po).

A base question q has views v (one dataset row each) with image I_v, relation r_v and target y_v:
FULL and CONTROL -> a*, MISSING -> the abstention, SUBSTITUTE -> a_sub(v). Candidates
C_q = {a*, abstention} + {a_sub(v)}. Rows carry their linkage (harness.trainsets `views` column:
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

Choices made here (ARMS.md leaves them open):
- The answer prefix and the candidate tokens are found in token space: each candidate is rendered
  as the completion the model writes (harness.answers.format_answer) and tokenized; the tokens all
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

import functools
import json
from dataclasses import dataclass

import torch

from arms.common import BuildContext
from arms.papo import k3, masked_mean, real_only
from harness.data.records import RELATIONS  # FULL, CONTROL, MISSING, SUBSTITUTE (torch-free)

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


# --- candidate tokens


def candidate_tokens(token_lists: list[list[int]]) -> tuple[list[int], list[list[int]], list[int]]:
    """Split the tokenized rendered candidates into (shared prefix, continuations, scored lengths).

    continuation_c = candidate c's tokens after the shared prefix; its first `scored_c` tokens are its
    own (the shared suffix, e.g. a closing tag, is not scored; every candidate keeps at least one).
    """
    n = min(len(t) for t in token_lists)
    pre = 0
    while pre < n - 1 and all(t[pre] == token_lists[0][pre] for t in token_lists):
        pre += 1
    suf = 0
    while suf < n - pre - 1 and all(t[-1 - suf] == token_lists[0][-1 - suf] for t in token_lists):
        suf += 1
    conts = [t[pre:] for t in token_lists]
    return token_lists[0][:pre], conts, [len(c) - suf for c in conts]


# --- the knobs


@dataclass(frozen=True)
class EviKnobs:
    """The arm's EVI-PO fields (harness.schema.EviPoArm)."""

    lambda_direction: float = 0.1
    tau: float = 1.0
    lambda_evidence: float = 0.02
    kappa: float = 0.2
    mu: float = 1.0  # the CONTROL part's weight inside L_evi, relative to the MISSING part
    eta1: float = 0.0
    evidence_on_correct_only: bool = False

    @classmethod
    def from_arm(cls, arm: dict) -> "EviKnobs":
        return cls(**{k: arm[k] for k in ("lambda_direction", "tau", "lambda_evidence", "kappa", "mu", "eta1",
                                          "evidence_on_correct_only")})

    @property
    def any_term(self) -> bool:
        return self.lambda_direction > 0 or self.lambda_evidence > 0 or self.eta1 > 0


# --- the trainer: TRL's GRPO loss unchanged, plus L_dir and L_evi (arms.grpo.extra_terms_trainer_base)


class _Grader:
    """harness.rewards.score's correctness and abstention of one sampled completion (weights unused)."""

    correct, format_weight, invalid_penalty = 1.0, 0.0, 0.0


@functools.cache
def trainer_cls():
    from PIL import Image

    from arms.grpo import extra_terms_trainer_base, row_images
    from harness.answers import format_answer
    from harness.rewards import score

    Base = extra_terms_trainer_base()

    class EviPoTrainer(Base):
        """GRPOTrainer + the direction and evidence terms; see the module docstring."""

        def __init__(self, *args, knobs: EviKnobs, **kwargs):
            super().__init__(*args, **kwargs)
            self.knobs = knobs
            self.extra_loss_enabled = knobs.any_term
            self._tok = getattr(self.processing_class, "tokenizer", self.processing_class)
            self._cand_cache: dict[tuple, tuple] = {}

        # -- once per generation batch, no gradient

        def score_generation(self, inputs: list[dict], batch: dict) -> dict:
            k, dev = self.knobs, self.accelerator.device
            rows = [json.loads(x["row"]) for x in inputs]
            views = [json.loads(x["views"]) for x in inputs]
            relation = torch.tensor([RELATIONS.index(r["relation"]) for r in rows], device=dev)  # (B,)
            correct, abstained = self._grade(rows, batch["completion_ids"])  # (B,) each
            self._log_rollouts(relation, correct, abstained)
            out = {"evi_relation": relation}
            if k.lambda_direction > 0:
                out.update(self._direction_inputs(views, inputs))
            if k.lambda_evidence > 0:
                out.update(self._evidence_inputs(inputs, views, batch, correct))
            return out

        def _grade(self, rows: list[dict], completion_ids):
            """Per rollout: correct (the reward's relation-aware rule) and abstained, as the reward saw them."""
            eos, pad = set(self.eos_token_ids), self._tok.pad_token_id
            correct, abstained = [], []
            for r, ids in zip(rows, completion_ids.tolist()):
                end = next((j for j, t in enumerate(ids) if t in eos), None)
                truncated = end is None  # no end-of-sequence within max_completion_length
                ids = [t for t in ids if t != pad] if truncated else ids[: end + 1]
                tr = score(self._tok.decode(ids, skip_special_tokens=True), r, truncated=truncated, cfg=_Grader)
                correct.append(tr.correct)
                abstained.append(tr.abstained and not truncated)
            dev = self.accelerator.device
            return (torch.tensor(correct, dtype=torch.float32, device=dev),
                    torch.tensor(abstained, dtype=torch.float32, device=dev))

        def _log_rollouts(self, relation, correct, abstained) -> None:
            logged = {}
            for code, name in enumerate(RELATIONS):
                sel = (relation == code).float()
                logged[f"evi/{name}/accuracy"] = ((correct * sel).sum(), sel.sum())
                logged[f"evi/{name}/abstain"] = ((abstained * sel).sum(), sel.sum())
            self.log_sums(logged)

        def _candidate_split(self, cands: list[str]):
            key = tuple(cands)
            if key not in self._cand_cache:
                toks = [self._tok(format_answer(c), add_special_tokens=False)["input_ids"] for c in cands]
                self._cand_cache[key] = candidate_tokens(toks)
            return self._cand_cache[key]

        def _direction_inputs(self, views: list[dict], inputs: list[dict]) -> dict:
            """Per row: the candidate continuations of its view, filled on the view's owner row only."""
            dev, rank = self.accelerator.device, self.accelerator.process_index
            B = len(inputs)
            # the owner of a view is the row of its first completion in the generation round (harness.rounds)
            owner = [self.generation_round.slot(rank, i)[1] == 0 and len(v["candidates"]) >= 2
                     for i, v in enumerate(views)]
            split = [self._candidate_split(v["candidates"]) if own else None for v, own in zip(views, owner)]
            C = max((len(s[1]) for s in split if s), default=1)
            L = max((len(s[0]) + len(c) for s in split if s for c in s[1]), default=1)
            ids = torch.zeros(B, C, L, dtype=torch.long)  # (B, C, L): shared prefix + continuation, right-padded
            real = torch.zeros(B, C, L, dtype=torch.long)  # attention on real tokens
            scored = torch.zeros(B, C, L)  # the candidate's own tokens
            target = torch.zeros(B, dtype=torch.long)
            for i, s in enumerate(split):
                if s is None:
                    continue
                prefix, conts, n_scored = s
                for c, (cont, n) in enumerate(zip(conts, n_scored)):
                    seq = prefix + cont
                    ids[i, c, : len(seq)] = torch.tensor(seq)
                    real[i, c, : len(seq)] = 1
                    scored[i, c, len(prefix): len(prefix) + n] = 1.0
                target[i] = views[i]["target_index"]
            owners = torch.tensor(owner, dtype=torch.bool)
            return {"evi_dir_ids": ids.to(dev), "evi_dir_real": real.to(dev), "evi_dir_scored": scored.to(dev),
                    "evi_dir_target": target.to(dev), "evi_dir_owner": owners.to(dev),
                    "evi_num_views": self.gather_sum(owners.sum())}

        def _evidence_inputs(self, inputs, views, batch, correct) -> dict:
            """m_miss / m_ctrl (B, T) on FULL rows with linked images (zeros elsewhere), and the rows' weights.
            One no-grad forward over the linked rows, once per linked image kind."""
            k, dev = self.knobs, self.accelerator.device
            cols = ["missing_image"] + (["control_image"] if k.mu > 0 else [])
            linked = [i for i, v in enumerate(views) if all(v.get(c) for c in cols)]
            weight = torch.zeros(len(inputs), device=dev)  # (B,)
            weight[linked] = 1.0
            if k.evidence_on_correct_only:
                weight = weight * correct
            T = batch["completion_ids"].size(1)
            m = torch.zeros(len(cols), len(inputs), T, device=dev)  # (kinds, B, T)
            if linked:
                opened: dict[tuple, object] = {}  # the G rows of one FULL prompt share their images
                images = [[self._open(views[i][c], like, opened) for like in row_images(inputs[i])]
                          for c in cols for i in linked]
                rows = linked * len(cols)
                pixel_values = self.pixels_like(batch, images, rows=rows)
                with torch.no_grad():
                    scored = self.score_completions(self.model, batch, pixel_values=pixel_values, rows=rows)
                m[:, linked] = scored.view(len(cols), len(linked), T)
            out = {"evi_rows": weight, "evi_m_miss": m[0]}
            if len(cols) > 1:
                out["evi_m_ctrl"] = m[1]
            mask = self.loss_mask(batch) * weight[:, None]
            out["evi_num_items"] = self.gather_sum(mask.sum())
            return out

        @staticmethod
        def _open(path: str, like, opened: dict):
            key = (path, like.size, like.mode)
            if key not in opened:
                img = Image.open(path)
                img = img.convert(like.mode) if img.mode != like.mode else img.copy()
                opened[key] = img if img.size == like.size else img.resize(like.size, Image.BILINEAR)
            return opened[key]

        # -- per micro-batch

        def extra_loss(self, model, inputs: dict, logp: torch.Tensor):
            k = self.knobs
            mask = self.loss_mask(inputs)  # (B, T)
            total = logp.new_zeros(())
            logged = {}
            if k.lambda_direction > 0:
                total = total + k.lambda_direction * self._direction_term(model, inputs, logged)
            if k.lambda_evidence > 0:
                emask = mask * inputs["evi_rows"][:, None]  # (B, T): FULL rollouts with linked views
                term, st = evidence_loss(logp, inputs["evi_m_miss"], emask, kappa=k.kappa,
                                         m_ctrl=inputs.get("evi_m_ctrl"), mu=k.mu)
                term = term * self.token_term_scale(emask, inputs["evi_num_items"])
                total = total + k.lambda_evidence * term
                n = st["tokens"]
                logged["loss/evidence"] = (term.detach() * n, n)
                logged["evi/FULL/kl_miss"] = (st["kl_miss"] * n, n)
                if "kl_ctrl" in st:
                    logged["evi/FULL/kl_ctrl"] = (st["kl_ctrl"] * n, n)
            if k.eta1 > 0:
                (p,) = real_only(mask, logp)
                scale = self.token_term_scale(mask, inputs["num_items_in_batch"])
                total = total + k.eta1 * masked_mean(-p, mask) * scale
            self.log_sums(logged)
            return total

        def direction_scores(self, model, inputs: dict, own: list[int]):
            """s(c|v) (V, C) for the owner rows `own`, and which candidates are real (V, C): one batched
            teacher-forced forward of every (view, candidate) pair, with gradient."""
            ids, real, scored = inputs["evi_dir_ids"][own], inputs["evi_dir_real"][own], inputs["evi_dir_scored"][own]
            V, C, L = ids.shape  # (V, C, L)
            pix = self.pixels_per_row(inputs, inputs["pixel_values"])
            ranges = self.image_ranges(inputs)
            rep = [r for r in own for _ in range(C)]  # each owner row once per candidate
            P = inputs["prompt_ids"].size(1)
            fw = {"pixel_values": torch.cat([pix[r] for r in rep]),
                  "image_grid_thw": inputs["image_grid_thw"][[i for r in rep for i in ranges[r]]]}
            for key in ("mm_token_type_ids", "token_type_ids"):
                if key in inputs:
                    tt = inputs[key][rep, :P]  # the prompt part; candidate tokens are text
                    fw[key] = torch.cat([tt, tt.new_zeros(len(rep), L)], dim=1)
            cand = ids.reshape(V * C, L)  # (V*C, L)
            input_ids = torch.cat([inputs["prompt_ids"][rep], cand], dim=1)  # (V*C, P+L)
            attn = torch.cat([inputs["prompt_mask"][rep], real.reshape(V * C, L)], dim=1)  # (V*C, P+L)
            # The untempered policy (ARMS.md): TRL's fused head divides the logits by the sampling temperature, so
            # the model's own forward (fused_lm_head off) scores the candidates; only the last L+1 logits are kept.
            with self.accelerator.autocast():
                logits = model(input_ids=input_ids, attention_mask=attn, logits_to_keep=L + 1, **fw).logits
            logits = logits[:, :L].float()  # (V*C, L, vocab): position P-1+l predicts candidate token l
            logps = torch.log_softmax(logits, dim=-1).gather(-1, cand.unsqueeze(-1)).squeeze(-1).reshape(V, C, L)
            (logps,) = real_only(scored, logps)
            scores = (logps * scored).sum(-1) / scored.sum(-1).clamp(min=1.0)  # (V, C), length-normalized
            return scores, scored.sum(-1) > 0

        def _direction_term(self, model, inputs: dict, logged: dict):
            """L_dir over this micro-batch's owner rows, scaled to a mean over the window's views."""
            own = inputs["evi_dir_owner"].nonzero().squeeze(1).tolist()
            relation = inputs["evi_relation"]
            if own:
                scores, valid = self.direction_scores(model, inputs, own)
                loss, st = direction_loss(scores, inputs["evi_dir_target"][own], tau=self.knobs.tau,
                                          candidate_mask=valid)
                loss = loss * self.window_scale(len(own), inputs["evi_num_views"])
            else:  # no owner in this micro-batch: a zero (ranks may differ in extra forwards)
                loss = torch.zeros((), device=relation.device)
                st = {"correct": torch.zeros(0, device=relation.device), "nll": torch.zeros(0, device=relation.device)}
            rel = relation[own]
            logged["loss/direction"] = (st["nll"].sum(), float(len(own)))
            for code, name in enumerate(RELATIONS):
                sel = (rel == code).float()
                logged[f"evi/{name}/dir_acc"] = ((st["correct"] * sel).sum(), sel.sum())
            return loss

    return EviPoTrainer


def build_trainer(ctx: BuildContext):
    from arms.grpo import build_trainer as build_grpo

    knobs = EviKnobs.from_arm(ctx.plan.config["arm"])
    return build_grpo(ctx, trainer_cls=functools.partial(trainer_cls(), knobs=knobs))
