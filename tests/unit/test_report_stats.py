"""harness.report.stats against values computed by hand (t intervals, exact and Monte Carlo bootstrap), published
t quantiles, and scipy.stats.bootstrap (the exact bootstrap against a resampling one)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from harness.report.stats import (bootstrap_means, mean_ci, multisets, paired_bootstrap, percentile_interval, t975,
                                  weighted_quantile)


def test_t_quantiles_match_the_published_table():
    # t_{0.975, df} as printed in Student-t tables (e.g. NIST/SEMATECH e-Handbook, section 1.3.6.7.2), to 3 decimals
    published = {1: 12.706, 2: 4.303, 4: 2.776, 10: 2.228, 30: 2.042, 35: 2.030, 100: 1.984}
    for df, t in published.items():
        assert t975(df) == pytest.approx(t, abs=5e-4), df
    assert t975(10**6) == pytest.approx(1.95996, abs=1e-4)  # the normal quantile in the limit
    assert t975(35) < t975(30)  # every df its own quantile (the old table used df 30's for 31..39)
    with pytest.raises(ValueError):
        t975(0)


def test_no_hand_typed_tables_left_in_the_harness():
    """The report's distributions come from scipy.stats: no module of harness/ keeps a t or z table (a dict or
    list of quantiles such as 12.706 / 4.303 / 1.96)."""
    from tests.conftest import REPO

    found = [p.relative_to(REPO).as_posix() for p in (REPO / "harness").rglob("*.py")
             if any(q in p.read_text() for q in ("12.706", "4.3026", "1.95996", "1.959964", "2.7764"))]
    assert not found, found


@pytest.mark.parametrize("d", [[0.3, -0.1, 0.05, 0.2, -0.4], [0.12, -0.03, 0.07, 0.2, 0.01, -0.09, 0.15, 0.04],
                               [-0.092, 0.01, -0.2, 0.03, -0.25, -0.05]])
def test_exact_bootstrap_agrees_with_scipy_bootstrap(d):
    """scipy.stats.bootstrap (percentile method, 200,000 resamples) against the exact enumeration: its resampled
    means' empirical CDF lies within 0.005 of the exact CDF everywhere (Dvoretzky-Kiefer-Wolfowitz: a deviation that
    large has probability <= 2 exp(-2 * 200,000 * 0.005^2) = 1e-4), and its interval's ends are the exact ones up to
    the gap between neighbouring resampled means (1% of the data's range)."""
    d = np.array(d)
    res = scipy.stats.bootstrap((d,), np.mean, method="percentile", n_resamples=200_000, vectorized=True,
                                rng=np.random.default_rng(1))
    means, w, method = bootstrap_means(d)
    assert method == "exact"
    order = np.argsort(means)
    m, cdf = means[order], np.cumsum(w[order])
    grid = np.linspace(d.min(), d.max(), 61)
    exact = np.array([cdf[np.searchsorted(m, g, side="right") - 1] if g >= m[0] else 0.0 for g in grid])
    mc = np.searchsorted(np.sort(res.bootstrap_distribution), grid, side="right") / res.bootstrap_distribution.size
    assert np.abs(exact - mc).max() < 0.005
    b = paired_bootstrap(d.tolist())
    tol = 0.01 * (d.max() - d.min())
    assert b["low"] == pytest.approx(res.confidence_interval.low, abs=tol)
    assert b["high"] == pytest.approx(res.confidence_interval.high, abs=tol)


def test_percentile_interval_is_the_inverted_cdf_rule():
    # 40 equally likely values 1..40: Q(0.025) = the 1st (CDF 1/40 = 0.025 reaches it), Q(0.975) = the 39th
    assert percentile_interval(np.arange(1, 41)) == (1.0, 39.0)


def test_mean_ci_by_hand():
    # 0.50, 0.60, 0.70: mean 0.60; deviations -0.1, 0, 0.1; sd = sqrt(0.02 / 2) = 0.1;
    # half-width = t_{0.975,2} * sd / sqrt(3) = 4.302653 * 0.1 / 1.7320508 = 0.2484138 (t_{0.975,2} = 4.302653 from
    # a printed table)
    s = mean_ci([0.50, 0.60, 0.70])
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.60)
    assert s["sd"] == pytest.approx(0.1)
    assert s["half_width"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3))
    assert s["half_width"] == pytest.approx(0.2484138, abs=1e-7)
    # 0.50, 0.70: mean 0.6, sd = sqrt((0.01 + 0.01) / 1) = 0.141421; hw = 12.706205 * 0.141421 / sqrt(2) = 1.2706205
    assert mean_ci([0.5, 0.7])["half_width"] == pytest.approx(1.2706205)
    one = mean_ci([0.42])
    assert one == {"n": 1, "mean": 0.42, "sd": None, "t": None, "half_width": None}
    assert mean_ci([])["mean"] is None
    assert mean_ci([None, 0.3])["n"] == 1  # missing values are not seeds


def test_multisets_count_and_weights():
    for n in (1, 2, 3, 4, 6):
        counts, w = multisets(n)
        assert counts.shape == (math.comb(2 * n - 1, n), n)
        assert (counts.sum(axis=1) == n).all()
        assert w.sum() == pytest.approx(1.0)
    counts, w = multisets(2)
    # {0,0}: 1/4, {0,1}: 2!/(1!1!)/2^2 = 1/2, {1,1}: 1/4
    assert sorted(zip(map(tuple, counts.tolist()), w.round(12).tolist())) == [((0, 2), 0.25), ((1, 1), 0.5),
                                                                              ((2, 0), 0.25)]


def test_exact_bootstrap_n2_by_hand():
    # d = 0.05, 0.10: resampled means 0.05 (1/4), 0.075 (1/2), 0.10 (1/4); CDF 0.25, 0.75, 1.
    # Q(0.025) = 0.05 (first CDF >= 0.025), Q(0.975) = 0.10.
    b = paired_bootstrap([0.05, 0.10])
    assert b["method"] == "exact" and b["n"] == 2
    assert b["mean"] == pytest.approx(0.075)
    assert (b["low"], b["high"]) == (pytest.approx(0.05), pytest.approx(0.10))


def test_exact_bootstrap_n3_by_hand():
    # d = 0.05, 0.10, 0.02 (a, b, c). The 10 multisets, probability k/27:
    #   ccc 0.02 (1), acc 0.03 (3), aac 0.04 (3), aaa 0.05 (1), bcc 0.04667 (3), abc 0.05667 (6),
    #   aab 0.06667 (3), bbc 0.07333 (3), abb 0.08333 (3), bbb 0.10 (1).
    # P(min) = 1/27 = 0.037 >= 0.025 -> Q(0.025) = 0.02; CDF below the max = 26/27 = 0.963 < 0.975 -> Q(0.975) = 0.10.
    b = paired_bootstrap([0.05, 0.10, 0.02])
    assert b["mean"] == pytest.approx(0.17 / 3)
    assert (b["low"], b["high"]) == (pytest.approx(0.02), pytest.approx(0.10))
    counts, w = multisets(3)
    means = counts @ np.array([0.05, 0.10, 0.02]) / 3
    assert sorted((round(m, 5), round(p * 27)) for m, p in zip(means, w)) == [
        (0.02, 1), (0.03, 3), (0.04, 3), (0.04667, 3), (0.05, 1), (0.05667, 6), (0.06667, 3), (0.07333, 3),
        (0.08333, 3), (0.1, 1)]


def test_exact_bootstrap_n4_binomial_by_hand():
    # d = 0, 0, 0, 1: the resampled mean is k/4 with k ~ Binomial(4, 1/4):
    # P(k) = 81, 108, 54, 12, 1 (/256); CDF 0.316, 0.738, 0.949, 0.996, 1 -> Q(0.025) = 0, Q(0.975) = 3/4.
    b = paired_bootstrap([0.0, 0.0, 0.0, 1.0])
    assert (b["low"], b["high"], b["mean"]) == (0.0, pytest.approx(0.75), pytest.approx(0.25))


def test_exact_equals_brute_force_over_ordered_resamples():
    d = np.array([0.3, -0.1, 0.05, 0.2, -0.4])
    means = np.array([d[list(idx)].mean() for idx in itertools.product(range(5), repeat=5)])  # 5^5 equally likely
    want = np.quantile(means, [0.025, 0.975], method="inverted_cdf")
    b = paired_bootstrap(d.tolist())
    assert (b["low"], b["high"]) == (pytest.approx(want[0]), pytest.approx(want[1]))


def test_monte_carlo_beyond_ten_is_seeded_and_deterministic():
    d = np.linspace(-0.2, 0.3, 12)
    b1, b2 = paired_bootstrap(d.tolist()), paired_bootstrap(d.tolist())
    assert b1 == b2 and b1["method"] == "monte_carlo"
    idx = np.random.default_rng(0).integers(0, 12, size=(10_000, 12))
    want = np.quantile(d[idx].mean(axis=1), [0.025, 0.975], method="inverted_cdf")
    assert (b1["low"], b1["high"]) == (pytest.approx(want[0]), pytest.approx(want[1]))
    assert paired_bootstrap(d[:10].tolist())["method"] == "exact"


def test_degenerate_pairs():
    assert paired_bootstrap([]) == {"n": 0, "mean": None, "low": None, "high": None, "method": "none"}
    one = paired_bootstrap([0.07])
    assert one["mean"] == 0.07 and one["low"] is None and one["high"] is None


def test_weighted_quantile_lands_on_a_step():
    # CDF exactly 0.5 at the first value: the 0.5-quantile is that value (the smallest with CDF >= q).
    v, w = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    assert weighted_quantile(v, w, 0.5) == 1.0
    assert weighted_quantile(v, w, 0.51) == 2.0
