"""PAPO's pure terms (arms.papo): hand-computed values, finite-difference gradients, padding that never
contributes, and the PIL patch mask. The trainer glue is tested in test_trl_contract.py."""

from __future__ import annotations

import math

import pytest

import torch  # noqa: E402  (a broken install must fail, not skip)

from arms.papo.terms import k3, mask_image, mask_seed, masked_mean, papo_terms  # noqa: E402

# --- k3 and the masked mean


def test_k3_hand_values_and_clamps():
    p = torch.tensor([0.0, 0.0, -1.0, 0.0, 0.0])
    m = torch.tensor([0.0, math.log(2.0), -1.0 + math.log(0.5), 30.0, -30.0])
    got = k3(p, m)
    # d = m - p = +30 and -30 are clamped to +-20, and the estimates (e^20 - 21, e^-20 + 19) to 10
    want = [0.0, 1.0 - math.log(2.0), 0.5 - math.log(0.5) - 1.0, 10.0, 10.0]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)


def test_k3_matches_an_independent_reference_on_random_logprobs():
    """k3 elementwise equals min(exp(d) - d - 1, 10), d = clamp(m - p, -20, 20), computed here in plain Python
    floats on random log-probs in (-13, 0] (many estimates exceed the clamp at 10) and on three fixed pairs:
    d = -25 and d = +25 (the +-20 clamp) and d = 0."""
    gen = torch.Generator().manual_seed(0)
    p = -torch.rand(400, generator=gen, dtype=torch.float64) * 13
    m = -torch.rand(400, generator=gen, dtype=torch.float64) * 13
    p[:3] = torch.tensor([0.0, -25.0, -3.0], dtype=torch.float64)
    m[:3] = torch.tensor([-25.0, 0.0, -3.0], dtype=torch.float64)

    def reference(pi: float, mi: float) -> float:
        d = max(-20.0, min(20.0, mi - pi))
        return min(math.exp(d) - d - 1.0, 10.0)

    want = torch.tensor([reference(a, b) for a, b in zip(p.tolist(), m.tolist())], dtype=torch.float64)
    got = k3(p, m)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert got[:3].tolist() == [10.0, 10.0, 0.0]  # d clamped to -20 (e^-20 + 19) and +20, then to 10; d = 0
    clipped = int((want == 10.0).sum())
    assert 0 < clipped < 400  # both sides of the clamp are exercised


def test_masked_mean_is_over_all_real_tokens_not_per_sequence():
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(16.0 / 4.0)  # token mode: (1+2+3+10)/4, not (2+10)/2
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


# --- papo_terms


def _example():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, 0.0]], dtype=torch.float64)
    masked = torch.tensor([[-1.0 + math.log(2.0), -2.0, -1.5], [-0.3 + math.log(0.5), -9.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    return logp, masked, mask


def test_papo_terms_hand_computed():
    logp, masked, mask = _example()
    kl = [1.0 - math.log(2.0), 0.0, math.exp(-1.0) + 1.0 - 1.0, 0.5 - math.log(0.5) - 1.0]  # the 4 real tokens
    neg_p = [1.0, 2.0, 0.5, 0.3]
    neg_m = [1.0 - math.log(2.0), 2.0, 1.5, 0.3 - math.log(0.5)]
    gamma, eta1, eta2 = 0.02, 0.05, 0.07
    want = -gamma * sum(kl) / 4 + eta1 * sum(neg_p) / 4 + eta2 * sum(neg_m) / 4
    loss, stats = papo_terms(logp, masked, mask, gamma=gamma, eta1=eta1, eta2=eta2)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert stats["kl_prcp"].item() == pytest.approx(sum(kl) / 4, rel=1e-12)
    assert stats["entropy_orig"].item() == pytest.approx(sum(neg_p) / 4)
    assert stats["entropy_masked"].item() == pytest.approx(sum(neg_m) / 4)
    assert stats["tokens"].item() == 4 and stats["kl_clip_ratio"].item() == 0.0


def test_papo_terms_kappa_clamps_the_kl_and_counts_clipped_tokens():
    logp, masked, mask = _example()
    loss, stats = papo_terms(logp, masked, mask, gamma=1.0, kappa=0.2)
    kl = [1.0 - math.log(2.0), 0.0, math.exp(-1.0), 0.5 - math.log(0.5) - 1.0]
    assert loss.item() == pytest.approx(-sum(min(v, 0.2) for v in kl) / 4, rel=1e-12)
    assert stats["kl_clip_ratio"].item() == pytest.approx(sum(v >= 0.2 for v in kl) / 4)


def test_papo_terms_zero_coefficients_give_exactly_zero():
    logp, masked, mask = _example()
    logp.requires_grad_(True)
    loss, _ = papo_terms(logp, masked, mask, gamma=0.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(logp.grad) == 0


@pytest.mark.parametrize("grad_masked", [False, True])
def test_papo_terms_finite_difference_gradients(grad_masked):
    torch.manual_seed(0)
    logp = (-torch.rand(3, 5, dtype=torch.float64) * 2).requires_grad_(True)
    masked = (logp.detach() + 0.3 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_(grad_masked)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float64)

    def f(lp, mp):
        return papo_terms(lp, mp, mask, gamma=0.5, kappa=10.0, eta1=0.1, eta2=0.2)[0]

    assert torch.autograd.gradcheck(f, (logp, masked), eps=1e-6, atol=1e-7)


def test_papo_terms_gradient_matches_the_analytic_form():
    # d/dp of -gamma * k3(p, m) = -gamma * (1 - exp(m - p)); eta1 * (-p) -> -eta1; one token each
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    masked = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    gamma, eta1 = 0.3, 0.1
    papo_terms(logp, masked, mask, gamma=gamma, eta1=eta1)[0].backward()
    want = (-gamma * (1 - torch.exp(masked - logp.detach())) - eta1) / 2
    assert torch.allclose(logp.grad, want)


def test_padding_never_contributes_even_when_it_holds_inf_or_nan():
    logp, masked, mask = _example()
    dirty_p, dirty_m = logp.clone(), masked.clone()
    dirty_p[1, 1:] = torch.tensor([float("nan"), float("-inf")], dtype=torch.float64)
    dirty_m[1, 1:] = torch.tensor([float("inf"), float("nan")], dtype=torch.float64)
    dirty_p.requires_grad_(True)
    clean_p = logp.clone().requires_grad_(True)
    kw = dict(gamma=0.4, kappa=10.0, eta1=0.1, eta2=0.1)
    dirty, _ = papo_terms(dirty_p, dirty_m, mask, **kw)
    clean, _ = papo_terms(clean_p, masked, mask, **kw)
    dirty.backward()
    clean.backward()
    assert torch.isfinite(dirty) and dirty.item() == clean.item()
    assert torch.equal(dirty_p.grad[mask == 0], torch.zeros(2, dtype=torch.float64))  # exactly zero
    assert torch.equal(dirty_p.grad, clean_p.grad)


def test_above_kappa_the_kl_has_no_gradient():
    logp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    masked = torch.tensor([[-5.0]], dtype=torch.float64)  # k3 = e^-5 + 4 > kappa = 1
    papo_terms(logp, masked, torch.ones(1, 1, dtype=torch.float64), gamma=1.0, kappa=1.0)[0].backward()
    assert logp.grad.item() == 0.0


# --- the PIL patch mask


def _image(w: int, h: int, mode: str = "RGB"):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(1, 256, size=(h, w, channels), dtype=np.uint8)  # no pixel is black before masking
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode=mode)


def test_mask_image_is_deterministic_per_seed_and_keeps_size_and_mode():
    img = _image(56, 56)
    before = img.tobytes()
    a = mask_image(img, patch_size=14, ratio=0.6, seed=7)
    b = mask_image(img, patch_size=14, ratio=0.6, seed=7)
    c = mask_image(img, patch_size=14, ratio=0.6, seed=8)
    assert a.tobytes() == b.tobytes() and a.tobytes() != c.tobytes()
    assert a.size == img.size and a.mode == img.mode
    assert img.tobytes() == before  # the input image is not modified


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_mask_image_blackens_whole_cells_with_frequency_close_to_ratio(mode):
    import numpy as np

    ps, side, ratio = 7, 700, 0.6  # 100 x 100 = 10,000 cells
    src = np.array(_image(side, side, mode))
    out = np.array(mask_image(_image(side, side, mode), patch_size=ps, ratio=ratio, seed=3))
    color = out[..., :3] if mode == "RGBA" else out
    black = (color == 0).reshape(side, side, -1).all(-1)  # (H, W)
    cells = black.reshape(side // ps, ps, side // ps, ps).transpose(0, 2, 1, 3).reshape(-1, ps * ps)
    assert (cells.all(1) | ~cells.any(1)).all()  # every cell is all black or untouched
    assert abs(cells.all(1).mean() - ratio) < 0.02
    untouched = ~black
    assert (out[untouched] == src[untouched]).all()
    if mode == "RGBA":
        assert (out[..., 3] == src[..., 3]).all()  # alpha kept


def test_mask_image_partial_edge_cells_and_extreme_ratios():
    import numpy as np

    img = _image(30, 20)  # 3 x 2 cells of 14 px, the last column and row partial
    assert np.array(mask_image(img, patch_size=14, ratio=1.0, seed=0)).max() == 0
    assert mask_image(img, patch_size=14, ratio=0.0, seed=0).tobytes() == img.tobytes()
    assert mask_image(img, patch_size=14, ratio=0.5, seed=0).size == (30, 20)
    with pytest.raises(ValueError):
        mask_image(img, patch_size=0, ratio=0.5, seed=0)


def test_mask_seed_separates_run_seed_step_slot_and_image():
    seeds = {mask_seed(0, 0, 0), mask_seed(1, 0, 0), mask_seed(0, 1, 0), mask_seed(0, 0, 1), mask_seed(0, 0, 0, 1)}
    assert len(seeds) == 5
    # A resumed run (a new process) must derive the same seed: pinned values, sha256("papo-mask:3:5:2:0")'s
    # first 8 bytes little-endian; any process-dependent seed (hash(), a global RNG) fails here.
    assert mask_seed(3, 5, 2) == 13134910644787332360 and mask_seed(0, 0, 0) == 2290350527461985491
    assert mask_seed(3, 5, 2) == mask_seed(3, 5, 2, 0)  # image_index defaults to 0
