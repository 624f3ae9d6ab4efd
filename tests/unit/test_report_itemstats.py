"""harness.report.itemstats (hierarchical bootstrap, paired by view id) and harness.report.power (seeds and items
needed) against hand-worked distributions, the exact per-seed bootstrap, published sample sizes and a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from harness.report.itemstats import align, hierarchical_bootstrap, item_differences, replicates
from harness.report.power import n_for_power, needed, normal_approx_n, t_test_power
from harness.report.stats import paired_bootstrap

# --- hierarchical bootstrap


def test_two_seeds_two_views_by_hand():
    """Seed A: differences 0 and 1 over its two views; seed B: 1 and 1. A replicate draws two seed slots, then two
    views in each. Slots AA (1/4): the mean of two draws of A's view-mean, each 0, 1/2, 1 with 1/4, 1/2, 1/4, so
    0, .25, .5, .75, 1 with 1, 4, 6, 4, 1 (/16); AB or BA (1/2): (A's view-mean + 1) / 2 = .5, .75, 1 with 1/4, 1/2,
    1/4; BB (1/4): 1. Together (/64): 0: 1, .25: 4, .5: 6 + 8 = 14, .75: 4 + 16 = 20, 1: 1 + 8 + 16 = 25.
    CDF: 1/64 = .016 < .025 at 0, 5/64 = .078 at .25 -> Q(.025) = .25; Q(.975) = 1. Mean: (0.5 + 1) / 2 = .75."""
    a = [{"v1": 1, "v2": 1}, {"v1": 1, "v2": 1}]
    b = [{"v1": 1, "v2": 0}, {"v1": 0, "v2": 0}]
    reps = replicates(align(a, b), resamples=40_000)
    want = {0.0: 1, 0.25: 4, 0.5: 14, 0.75: 20, 1.0: 25}
    for value, k in want.items():  # 40,000 draws: sd of a frequency <= 0.0025; 0.012 is ~5 sd
        assert np.mean(np.isclose(reps, value)) == pytest.approx(k / 64, abs=0.012), value
    hb = hierarchical_bootstrap(a, b, resamples=40_000)
    assert (hb["mean"], hb["low"], hb["high"]) == (pytest.approx(0.75), 0.25, 1.0)
    assert hb["n_seeds"] == 2 and hb["n_items"] == [2, 2]


def test_without_item_noise_it_is_the_per_seed_bootstrap():
    """Every view of a seed has the same difference (0.1, 0.3, 0.2): resampling views changes nothing, and the
    interval is the exact per-seed bootstrap's: [min, max] at 3 seeds (each extreme has probability 1/27 > 2.5%)."""
    a = [{f"v{i}": d for i in range(50)} for d in (0.1, 0.3, 0.2)]
    b = [{f"v{i}": 0.0 for i in range(50)} for _ in range(3)]
    hb, exact = hierarchical_bootstrap(a, b), paired_bootstrap([0.1, 0.3, 0.2])
    assert (hb["low"], hb["high"]) == (pytest.approx(exact["low"]), pytest.approx(exact["high"]))
    assert hb["mean"] == pytest.approx(exact["mean"])


def _shared_difficulty(seeds: int = 5, views: int = 200, gain: float = 0.03) -> tuple[list[dict], list[dict]]:
    """Views whose difficulty spans [0.05, 0.95], shared by both arms: on each seed one uniform draw per view decides
    both arms (arm a right when u < p + gain, b when u < p), so a view's outcomes move together."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0.05, 0.95, size=views)
    a, b = [], []
    for _ in range(seeds):
        u = rng.uniform(size=views)
        a.append({f"v{i}": float(u[i] < p[i] + gain) for i in range(views)})
        b.append({f"v{i}": float(u[i] < p[i]) for i in range(views)})
    return a, b


def test_item_pairing_narrows_the_interval_when_views_share_their_difficulty():
    a, b = _shared_difficulty()
    paired = hierarchical_bootstrap(a, b)
    unpaired = hierarchical_bootstrap(a, b, paired_items=False)
    assert paired["mean"] == unpaired["mean"] == pytest.approx(0.03, abs=0.01)
    width = lambda r: r["high"] - r["low"]  # noqa: E731
    assert width(paired) < 0.5 * width(unpaired), (paired, unpaired)
    assert paired["low"] > 0 > unpaired["low"]  # the pairing tells the arms apart; ignoring it does not


def test_views_pair_by_id_not_by_position_and_only_common_views_count():
    a = [{"x": 1.0, "y": 0.0, "z": 1.0}, {"x": 0.0, "y": 1.0}]
    b = [{"z": 0.0, "y": 1.0, "x": 1.0, "only_b": 1.0}, {"y": 1.0, "x": 1.0}]
    (a0, b0), (a1, b1) = align(a, b)
    assert a0.tolist() == [1.0, 0.0, 1.0] and b0.tolist() == [1.0, 1.0, 0.0]  # x, y, z
    assert a1.tolist() == [0.0, 1.0] and b1.tolist() == [1.0, 1.0]
    hb = hierarchical_bootstrap(a, b)
    assert hb["n_items"] == [3, 2] and hb["mean"] == pytest.approx((0.0 + -0.5) / 2)
    assert hierarchical_bootstrap(a, b) == hb  # deterministic (default_rng(HB_SEED))
    assert hierarchical_bootstrap(a, b, seed=1)["rng_seed"] == 1
    # the views on every seed: x ((1 - 1) + (0 - 1)) / 2 and y ((0 - 1) + (1 - 1)) / 2
    assert item_differences(a, b).tolist() == [-0.5, -0.5]
    with pytest.raises(ValueError, match="paired by seed"):
        align(a, b[:1])


def test_no_common_view_gives_no_interval():
    hb = hierarchical_bootstrap([{"a": 1.0}], [{"b": 1.0}])
    assert hb["n_seeds"] == 0 and hb["mean"] is None and hb["low"] is None


# --- seeds and items needed (power of a paired t-test)


@pytest.mark.parametrize("delta, n", [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_pairs_needed_match_published_sample_sizes(delta, n):
    """G*Power 3.1 (Faul et al. 2009), t tests, "means: difference from constant (one sample case)", two tails,
    alpha 0.05, power 0.80: d = 0.2 -> 199, 0.5 -> 34 (actual power 0.808), 0.8 -> 15, 1.0 -> 10."""
    assert n_for_power(delta) == n
    assert n_for_power(-delta) == n  # two-sided: the sign does not matter
    assert t_test_power(delta, n) >= 0.8 > t_test_power(delta, n - 1)


def test_pairs_needed_against_the_normal_approximation_with_the_t_correction():
    """Guenther (1981): n ~ ((z_.975 + z_.8) / delta)^2 + z_.975^2 / 2; the exact t-test number is that, rounded up,
    or one more."""
    z = scipy.stats.norm.ppf(0.975)
    for delta in np.linspace(0.1, 1.2, 23):
        approx = normal_approx_n(delta) + z**2 / 2
        assert normal_approx_n(delta) == pytest.approx(((1.959964 + 0.841621) / delta) ** 2, rel=1e-5)
        assert n_for_power(delta) - math.ceil(approx) in (0, 1), delta


def test_power_agrees_with_a_simulated_t_test():
    """20,000 simulated paired samples of 34 differences ~ N(0.5, 1): the share a two-sided t-test at 0.05 rejects
    is the power the noncentral t gives (0.808), within 4 simulation sd (0.011)."""
    rng = np.random.default_rng(3)
    d = rng.normal(0.5, 1.0, size=(20_000, 34))
    rejected = np.mean(scipy.stats.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05)
    assert rejected == pytest.approx(t_test_power(0.5, 34), abs=0.011)
    assert t_test_power(0.5, 34) == pytest.approx(0.8078, abs=5e-4)


def test_needed_from_observed_differences():
    # d = 0.1, 0.2, 0.3: mean 0.2, sd 0.1, effect 2.0 -> 5 pairs (power 0.909; 4 pairs: 0.755)
    n = needed([0.1, 0.2, 0.3])
    assert (n["mean"], n["sd"], n["effect"], n["needed"]) == (pytest.approx(0.2), pytest.approx(0.1),
                                                              pytest.approx(2.0), 5)
    assert needed([0.1, -0.1])["needed"] is None  # mean 0: no number of seeds shows it
    assert needed([0.2, 0.2, 0.2])["needed"] == 2  # no spread: the smallest test
    assert needed([0.3])["needed"] is None and needed([0.3])["sd"] is None
    assert math.isclose(needed([0.0, 0.1])["effect"], 0.05 / math.sqrt(0.005))
