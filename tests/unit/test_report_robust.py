"""harness.report.robust (rliable's IQM, stratified bootstrap, probability of improvement, performance profile)
against scipy.stats.trim_mean, scipy.stats.mannwhitneyu and hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from harness.report.robust import iqm, performance_profile, probability_of_improvement, stratified_iqm


def test_iqm_by_hand_and_against_scipy_trim_mean():
    assert iqm([1, 2, 3, 4, 100]) == 3.0  # floor(5/4) = 1 off each end: mean(2, 3, 4)
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # 2 off each end: mean(3, 4, 5, 6)
    assert iqm([0.2, 0.9, 0.4]) == pytest.approx(0.5)  # floor(3/4) = 0: the mean
    rng = np.random.default_rng(0)
    for n in range(1, 22):
        x = rng.normal(size=n) ** 3  # heavy tails: a wrong trim shows
        assert iqm(x) == pytest.approx(scipy.stats.trim_mean(x, 0.25)), n


def test_stratified_bootstrap_by_hand():
    """Two runs, two relations of equal share, run 1 scores (0, 1), run 2 (1, 0): both runs' accuracy is 0.5, so a
    plain bootstrap of runs never moves: [0.5, 0.5]. Stratified, each relation's column is resampled on its own:
    the replicate is (A + B) / 2 with A, B independent means of two draws from {0, 1}: 0, .5, 1 with 1/4, 1/2, 1/4.
    So 0, .25, .5, .75, 1 with 1, 4, 6, 4, 1 (/16): P(0) = .0625 >= .025 -> low 0; CDF(.75) = .9375 -> high 1."""
    s = np.array([[0.0, 1.0], [1.0, 0.0]])
    strat = stratified_iqm(s, [0.5, 0.5])
    assert (strat["iqm"], strat["low"], strat["high"], strat["strata"]) == (0.5, 0.0, 1.0, 2)
    plain = stratified_iqm(s @ [0.5, 0.5])
    assert (plain["iqm"], plain["low"], plain["high"], plain["strata"]) == (0.5, 0.5, 0.5, 0)


def test_plain_bootstrap_of_three_runs_is_their_range():
    # n = 3: the IQM is the mean; the extremes (all three draws the min, or the max) each have probability 1/27 > 2.5%
    r = stratified_iqm([0.2, 0.5, 0.6])
    assert (r["low"], r["high"]) == (pytest.approx(0.2), pytest.approx(0.6)) and r["iqm"] == pytest.approx(1.3 / 3)
    assert stratified_iqm([0.4])["low"] is None and stratified_iqm([0.4])["iqm"] == 0.4
    assert stratified_iqm([0.2, 0.5, 0.6]) == r  # deterministic


def test_the_weights_rebuild_each_run_from_its_relations():
    # relation shares 3/4 and 1/4: runs 0.6 * .75 + 0.2 * .25 = 0.5 and 0.8 * .75 + 0.4 * .25 = 0.7; IQM of 2 = mean
    r = stratified_iqm([[0.6, 0.2], [0.8, 0.4]], [0.75, 0.25])
    assert r["iqm"] == pytest.approx(0.6) and 0.45 <= r["low"] <= r["high"] <= 0.75


def test_probability_of_improvement_by_hand_and_against_mann_whitney():
    # x = .6, .7 against y = .5, .7: pairs .6>.5 (1), .6<.7 (0), .7>.5 (1), .7=.7 (1/2): 2.5 / 4
    assert probability_of_improvement([0.6, 0.7], [0.5, 0.7])["p"] == 0.625
    rng = np.random.default_rng(1)
    for n, m in ((5, 5), (3, 7), (10, 4)):
        x, y = rng.integers(0, 6, size=n) / 5, rng.integers(0, 6, size=m) / 5  # coarse: ties happen
        u = scipy.stats.mannwhitneyu(x, y).statistic  # U of x: pairs x > y, ties half
        assert probability_of_improvement(x, y)["p"] == pytest.approx(u / (n * m))
    assert probability_of_improvement([0.5, 0.5], [0.5, 0.5])["p"] == 0.5


def test_probability_of_improvement_interval():
    far = probability_of_improvement([0.8, 0.9, 0.85], [0.1, 0.2, 0.15])
    assert (far["p"], far["low"], far["high"]) == (1.0, 1.0, 1.0)  # every resample: every x above every y
    mixed = probability_of_improvement([0.5, 0.7, 0.6, 0.4], [0.45, 0.65, 0.55, 0.5])
    assert mixed["low"] < mixed["p"] < mixed["high"] and 0.0 <= mixed["low"] and mixed["high"] <= 1.0
    one = probability_of_improvement([0.7], [0.5, 0.6])
    assert one["p"] == 1.0 and one["low"] is None


def test_performance_profile_counts_runs_strictly_above():
    x = [0.2, 0.5, 0.5, 0.9]
    assert performance_profile(x, [0.0, 0.2, 0.5, 0.6, 0.9, 1.0]).tolist() == [1.0, 0.75, 0.25, 0.25, 0.0, 0.0]
