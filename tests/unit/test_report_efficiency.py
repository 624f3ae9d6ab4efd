"""harness.report.efficiency: area under accuracy vs sampled tokens and tokens to a threshold against hand-worked
cases, and the ScaleRL fit against synthetic curves of known A and B (and its "not identifiable" verdicts)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.integrate

from harness.report.efficiency import auc, common_range, default_threshold, fit_scalerl, scalerl, tokens_to

X = np.array([0.0, 100.0, 200.0])
Y = np.array([0.2, 0.6, 0.6])


def test_auc_by_hand():
    # [0, 200]: (0.2 + 0.6) / 2 * 100 + 0.6 * 100 = 100, / 200 = 0.5
    assert auc(X, Y, 0.0, 200.0) == pytest.approx(0.5)
    # [50, 150]: y(50) = 0.4 (between the points); (0.4 + 0.6) / 2 * 50 + 0.6 * 50 = 55, / 100 = 0.55
    assert auc(X, Y, 50.0, 150.0) == pytest.approx(0.55)
    fine = np.linspace(50.0, 150.0, 100_001)  # scipy's trapezoid on a fine grid of the same linear curve
    assert auc(X, Y, 50.0, 150.0) == pytest.approx(scipy.integrate.trapezoid(np.interp(fine, X, Y), fine) / 100.0)
    assert common_range([(X, Y), (np.array([0.0, 90.0, 180.0]), Y)]) == (0.0, 180.0)
    assert common_range([(np.array([10.0, 20.0]), Y[:2]), (np.array([30.0, 40.0]), Y[:2])]) is None


def test_tokens_to_threshold_by_hand():
    x, y = np.array([0.0, 100.0, 200.0]), np.array([0.2, 0.6, 0.8])
    assert tokens_to(x, y, 0.5) == pytest.approx(75.0)  # 0 + (0.5 - 0.2) * 100 / (0.6 - 0.2)
    assert tokens_to(x, y, 0.7) == pytest.approx(150.0)
    assert tokens_to(x, y, 0.2) == 0.0  # the init already has it
    assert tokens_to(x, y, 0.9) is None  # not reached
    # the first crossing, not a later one: up to 0.7, down to 0.3, up to 0.9
    assert tokens_to([0, 100, 200, 300], [0.2, 0.7, 0.3, 0.9], 0.6) == pytest.approx(80.0)


def test_default_threshold_is_half_way_to_the_best_final():
    assert default_threshold([0.4, 0.5], [0.6, 0.85]) == pytest.approx(0.45 + 0.5 * 0.4)
    assert default_threshold([0.5], [0.5, 0.4]) is None  # no condition gains
    assert default_threshold([], [0.7]) is None


def test_scalerl_curve_by_hand():
    assert scalerl(0.0, 0.3, 0.8, 1.5, 2000.0) == pytest.approx(0.3)  # R(0) = R0
    assert scalerl(2000.0, 0.3, 0.8, 1.5, 2000.0) == pytest.approx(0.55)  # half the gain at C_mid
    assert scalerl(1e12, 0.3, 0.8, 1.5, 2000.0) == pytest.approx(0.8)  # the asymptote


def _curves(r0, a, b, c_mid, *, seeds=5, noise=0.01, points=9, top=80_000.0, zero=True, seed=1):
    """Seeds' eval curves of a known ScaleRL curve: eval before at 0 tokens, then points-1 evals up to `top` tokens
    (each seed's token counts jittered by 1%, as realized tokens are), accuracy + N(0, noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(seeds):
        x = np.linspace(top / (points - 1), top, points - 1) * (1 + 0.01 * rng.standard_normal(points - 1))
        x = np.concatenate([[0.0], x]) if zero else x
        out.append((x, scalerl(x, r0, a, b, c_mid) + noise * rng.standard_normal(x.size)))
    return out


@pytest.mark.parametrize("r0, a, b, c_mid, top", [(0.3, 0.8, 1.5, 20_000.0, 80_000.0),
                                                   (0.25, 0.6, 0.7, 30_000.0, 300_000.0)])
def test_fit_recovers_known_asymptote_and_efficiency(r0, a, b, c_mid, top):
    """Tolerances: A within 0.03 (accuracy units), B within 20% of B; 5 seeds x 9 evals, noise sd 0.01, the last
    evals at 4x and 10x C_mid (where the curve has covered 89% and 83% of its gain: a curve seen only up to half its
    gain has an asymptote the data do not pin down). The intervals hold the truth within the same tolerance."""
    f = fit_scalerl(_curves(r0, a, b, c_mid, top=top))
    assert f["identifiable"], f["reason"]
    assert f["A"] == pytest.approx(a, abs=0.03) and f["B"] == pytest.approx(b, rel=0.2)
    assert f["R0"] == pytest.approx(r0, abs=0.01) and f["C_mid"] == pytest.approx(c_mid, rel=0.3)
    (alo, ahi), (blo, bhi) = f["A_interval"], f["B_interval"]
    assert alo - 0.03 <= a <= ahi + 0.03 and blo * 0.8 <= b <= bhi * 1.2
    assert alo <= f["A"] <= ahi and ahi - alo < 0.15 and f["bad_refits"] <= 20


def test_fit_without_an_eval_before_fits_r0_too():
    f = fit_scalerl(_curves(0.3, 0.8, 1.5, 20_000.0, zero=False, points=10))
    assert f["identifiable"], f["reason"]
    assert f["A"] == pytest.approx(0.8, abs=0.03) and f["B"] == pytest.approx(1.5, rel=0.25)
    assert f["R0"] == pytest.approx(0.3, abs=0.1)


def test_not_identifiable_for_a_straight_line():
    x = np.linspace(0.0, 80_000.0, 9)
    line = [(x, 0.3 + 0.3 * x / 80_000.0) for _ in range(3)]  # no curvature: the asymptote runs off to A = 1
    f = fit_scalerl(line)
    assert not f["identifiable"] and "at a bound" in f["reason"], f
    rng = np.random.default_rng(2)
    shallow = [(x, 0.3 + 0.05 * x / 80_000.0 + 0.005 * rng.standard_normal(9)) for _ in range(5)]
    g = fit_scalerl(shallow)  # a nearly flat noisy line: the point fit may land inside, its refits do not
    assert not g["identifiable"] and ("at a bound" in g["reason"] or "refits" in g["reason"]), g
    assert g["A_interval"] is None and g["B_interval"] is None


def test_not_identifiable_with_three_points():
    f = fit_scalerl(_curves(0.3, 0.8, 1.5, 20_000.0, points=3, noise=0.0))
    assert not f["identifiable"] and f["reason"].startswith("too few points: 3 distinct"), f
    assert f["A"] is None and f["points"] == 3


def test_one_seed_fits_without_an_interval():
    f = fit_scalerl(_curves(0.3, 0.8, 1.5, 20_000.0, seeds=1, noise=0.002))
    assert f["identifiable"] and f["A"] == pytest.approx(0.8, abs=0.03) and f["A_interval"] is None
