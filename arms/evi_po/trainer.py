"""evi_po's trainer: TRL's GRPO loss unchanged, plus L_dir and L_evi (arms.evi_po.terms; docs/arms.md evi_po).
Imports torch and trl: loaded by the registry inside the process that trains.

Multi-process: ranks run different numbers of extra forwards (a rank may hold no FULL row); every
collective here (gathers of counts, metric reduces) is called on every rank in the same order.
"""

from __future__ import annotations

import functools
import json

import torch
from PIL import Image

from arms.common import BuildContext
from arms.evi_po.config import EviPoArm
from arms.evi_po.terms import candidate_tokens, direction_loss, evidence_loss
from arms.grpo.trainer import build_trainer as build_grpo
from arms.papo.terms import masked_mean, real_only
from arms.trl_hooks import ExtraTermsGRPOTrainer, row_images
from harness.rewards.answers import format_answer
from harness.data.records import RELATIONS  # FULL, CONTROL, MISSING, SUBSTITUTE (torch-free)
from harness.rewards import cut_at_eos, score


class _Grader:
    """harness.rewards.score's correctness and abstention of one sampled completion (weights unused)."""

    correct, format_weight, invalid_penalty = 1.0, 0.0, 0.0


class EviPoTrainer(ExtraTermsGRPOTrainer):
    """GRPOTrainer + the direction and evidence terms; see the module docstring."""

    window_totals = {"evi_num_views": "evi_dir_owner"}  # the direction term: a mean over its window's views

    def __init__(self, *args, knobs: EviPoArm, **kwargs):
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
            ids, truncated = cut_at_eos(ids, eos, pad)
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
        # The untempered policy (docs/arms.md): TRL's fused head divides the logits by the sampling temperature, so
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


def build_trainer(ctx: BuildContext):
    return build_grpo(ctx, trainer_cls=functools.partial(EviPoTrainer, knobs=ctx.plan.cfg.arm))
