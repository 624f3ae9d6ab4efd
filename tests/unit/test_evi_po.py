"""EVI-PO's pure terms (arms.evi_po.terms): hand-computed values, finite-difference gradients, padding (tokens
and candidates) that never contributes, the candidate token split, and the `views` linkage column.
The trainer glue is tested in test_trl_contract.py."""

from __future__ import annotations

import json
import math

import pytest

import torch  # noqa: E402  (a broken install must fail, not skip)

from arms.evi_po.terms import candidate_tokens, direction_loss, evidence_loss  # noqa: E402

# --- direction_loss


def test_direction_loss_hand_computed():
    # view 0: softmax([0, ln 2, 0]) = [1/4, 1/2, 1/4], target 1 -> ln 2; view 1: uniform over 3, target 0 -> ln 3
    scores = torch.tensor([[0.0, math.log(2.0), 0.0], [1.0, 1.0, 1.0]])
    loss, stats = direction_loss(scores, torch.tensor([1, 0]))
    assert loss.item() == pytest.approx((math.log(2.0) + math.log(3.0)) / 2, rel=1e-6)
    assert stats["correct"].tolist() == [1.0, 1.0]  # argmax ties resolve to the first index
    assert stats["target_prob"].tolist() == pytest.approx([0.5, 1 / 3])


def test_direction_loss_temperature():
    scores = torch.tensor([[0.0, 2.0 * math.log(3.0)]])
    loss, _ = direction_loss(scores, torch.tensor([1]), tau=2.0)  # softmax([0, ln 3]) = [1/4, 3/4]
    assert loss.item() == pytest.approx(-math.log(0.75), rel=1e-6)
    _, stats = direction_loss(scores, torch.tensor([0]), tau=2.0)
    assert stats["correct"].tolist() == [0.0]


def test_direction_loss_finite_difference_gradients():
    torch.manual_seed(0)
    scores = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 2, 1, 1])
    assert torch.autograd.gradcheck(lambda s: direction_loss(s, target, tau=0.7)[0], (scores,), eps=1e-6, atol=1e-7)


def test_padded_candidates_are_excluded_and_get_no_gradient():
    scores = torch.tensor([[0.3, -1.0, 7.0], [0.1, 0.2, 0.4]], dtype=torch.float64, requires_grad=True)
    valid = torch.tensor([[True, True, False], [True, True, True]])
    loss, _ = direction_loss(scores, torch.tensor([0, 2]), candidate_mask=valid)
    loss.backward()
    want = (-torch.log_softmax(torch.tensor([0.3, -1.0], dtype=torch.float64), 0)[0]
            - torch.log_softmax(torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64), 0)[2]) / 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    assert scores.grad[0, 2].item() == 0.0


def test_direction_loss_without_views_is_zero():
    scores = torch.zeros(0, 3, requires_grad=True)
    loss, stats = direction_loss(scores, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and stats["correct"].numel() == 0


# --- evidence_loss


def _example():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, 0.0]], dtype=torch.float64)
    m_miss = torch.tensor([[-1.0 + math.log(2.0), -2.5, -0.5], [-2.3, -9.0, 0.0]], dtype=torch.float64)
    m_ctrl = torch.tensor([[-1.0, -2.0 + math.log(0.5), -0.5], [-0.3, -4.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    return logp, m_miss, m_ctrl, mask


def _k3(d: float) -> float:
    return min(math.exp(d) - d - 1.0, 10.0)


def test_evidence_loss_hand_computed():
    logp, m_miss, m_ctrl, mask = _example()
    kl_miss = [_k3(math.log(2.0)), _k3(-0.5), 0.0, _k3(-2.0)]  # the 4 real tokens
    kl_ctrl = [0.0, _k3(math.log(0.5)), 0.0, 0.0]
    kappa, mu = 0.2, 0.5
    loss, stats = evidence_loss(logp, m_miss, mask, kappa=kappa)
    assert loss.item() == pytest.approx(-sum(min(v, kappa) for v in kl_miss) / 4, rel=1e-12)
    assert stats["kl_miss"].item() == pytest.approx(sum(kl_miss) / 4) and "kl_ctrl" not in stats
    loss, stats = evidence_loss(logp, m_miss, mask, kappa=kappa, m_ctrl=m_ctrl, mu=mu)
    want = -sum(min(v, kappa) for v in kl_miss) / 4 + mu * sum(kl_ctrl) / 4
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert stats["kl_ctrl"].item() == pytest.approx(sum(kl_ctrl) / 4)


def test_evidence_loss_finite_difference_gradients():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 4, dtype=torch.float64) * 2).requires_grad_(True)
    m_miss = logp.detach() + 0.2 * torch.randn(3, 4, dtype=torch.float64)  # k3 mostly below kappa = 10
    m_ctrl = logp.detach() + 0.2 * torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    f = lambda lp: evidence_loss(lp, m_miss, mask, kappa=10.0, m_ctrl=m_ctrl, mu=0.3)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (logp,), eps=1e-6, atol=1e-7)


def test_evidence_padding_never_contributes_and_kappa_stops_the_gradient():
    logp, m_miss, m_ctrl, mask = _example()
    dirty = logp.clone()
    dirty[1, 1:] = torch.tensor([float("nan"), float("inf")], dtype=torch.float64)
    dirty_miss = m_miss.clone()
    dirty_miss[1, 2] = float("nan")
    dirty.requires_grad_(True)
    clean = logp.clone().requires_grad_(True)
    a, _ = evidence_loss(dirty, dirty_miss, mask, kappa=0.2, m_ctrl=m_ctrl, mu=0.1)
    b, _ = evidence_loss(clean, m_miss, mask, kappa=0.2, m_ctrl=m_ctrl, mu=0.1)
    a.backward()
    b.backward()
    assert a.item() == b.item() and torch.equal(dirty.grad, clean.grad)
    assert torch.equal(dirty.grad[mask == 0], torch.zeros(2, dtype=torch.float64))
    # token (0, 0): k3 = 1 - ln 2 > kappa = 0.2 and no CONTROL difference there -> no gradient at all
    assert clean.grad[0, 0].item() == 0.0


def test_evidence_loss_on_an_empty_mask_is_zero():
    logp, m_miss, _, mask = _example()
    loss, stats = evidence_loss(logp, m_miss, torch.zeros_like(mask))
    assert loss.item() == 0.0 and stats["tokens"].item() == 0


# --- candidate tokens


def test_candidate_tokens_strip_the_shared_prefix_and_closing_tag():
    # the tiny tokenizer: "<answer>red</answer>" -> ['<answer', '>red', '</', 'answer', '>']
    toks = [[269, 358, 268, 267, 36], [269, 298, 268, 267, 36], [269, 355, 268, 267, 36]]
    prefix, conts, scored = candidate_tokens(toks)
    assert prefix == [269] and conts[1] == [298, 268, 267, 36] and scored == [1, 1, 1]


def test_candidate_tokens_of_unequal_length_keep_at_least_one_scored_token():
    prefix, conts, scored = candidate_tokens([[1, 5, 6, 9], [1, 5, 9], [1, 7, 8, 8, 9]])
    assert prefix == [1] and scored == [2, 1, 3]
    assert conts == [[5, 6, 9], [5, 9], [7, 8, 8, 9]]  # the shared closing token 9 is not scored
    # one a prefix of the other: the prefix stops one token short of the shorter candidate, no suffix is shared
    prefix, conts, scored = candidate_tokens([[1, 2], [1, 2, 2]])
    assert prefix == [1] and conts == [[2], [2, 2]] and scored == [1, 2]


# --- the views column (harness.data.trainsets)


def test_rl_dataset_rows_carry_their_views_linkage(tmp_path):
    from harness.data import ensure_synthetic, load_split
    from harness.data.trainsets import rl_dataset

    root = ensure_synthetic(n_base=8, data_seed=0, image_size=56, val_fraction=0.1, test_fraction=0.15,
                            cache_dir=tmp_path, workers=0)
    rows = load_split(root, "train")
    ds = rl_dataset(root, rows, is_vlm=True)
    assert {"prompt", "image", "row", "views"} <= set(ds.column_names)
    for r, links in zip(rows, (json.loads(v) for v in ds["views"])):
        assert links["candidates"][links["target_index"]] == r["target"] and "" in links["candidates"]
        if r["relation"] == "FULL":
            assert links["missing_image"].endswith(r["missing_images"][0]["path"])
            assert links["control_image"].endswith(r["control_images"][0]["path"])
        else:
            assert links["missing_image"] is None and links["control_image"] is None
    # rows without explicit candidates: the group's targets plus the abstention
    bare = [{k: v for k, v in r.items() if k != "candidates"} for r in rows]
    for r, links in zip(rows, (json.loads(v) for v in rl_dataset(root, bare, is_vlm=False)["views"])):
        assert sorted(links["candidates"]) == sorted(r["candidates"])


def test_mu_weighs_the_control_part_inside_l_evi_by_default_one(compose_cfg):
    """docs/arms.md: mu is the CONTROL part's weight inside L_evi, default 1.0 (it used to default to
    lambda_evidence, which made the CONTROL part 1/50 of the MISSING part)."""
    from omegaconf import OmegaConf

    from arms.evi_po.config import EviPoArm

    cfg, _ = compose_cfg("arm=evi_po")
    arm = OmegaConf.to_container(cfg.arm)
    assert arm["mu"] == 1.0 and arm["lambda_evidence"] == 0.02
    assert EviPoArm(**arm).mu == EviPoArm().mu == 1.0
