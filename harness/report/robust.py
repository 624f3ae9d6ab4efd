"""Robust aggregates over seeds, after rliable (Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the
Statistical Precipice", NeurIPS; github.com/google-research/rliable). numpy + scipy.stats.

- `iqm(x)`: the interquartile mean, the mean of the middle 50% of the runs: sort, drop floor(n/4) runs at each end,
  average the rest (scipy.stats.trim_mean(x, 0.25), which the tests check it against; rliable's
  `aggregate_iqm` is that call). Less sensitive to one outlying seed than the mean, less wasteful than the median.
  At n = 5 it is the mean of the middle 3, at n = 3 (floor(3/4) = 0) the plain mean.
- `stratified_iqm(scores, weights)`: its 95% percentile interval by a stratified bootstrap. rliable stratifies by
  task: each replicate resamples the runs within every task independently. Here the strata are the eval's relation
  groups (FULL, CONTROL, MISSING, SUBSTITUTE: each view belongs to one): every replicate draws n runs with
  replacement per relation, independently across relations, and rebuilds each resampled run's accuracy as the
  view-weighted mean of its relations' accuracies (weights: the relation's share of the eval's views; with the
  relations' own accuracies, that is the run's accuracy). Deviation from rliable: rliable pools every (run, task)
  score before trimming; the relations are not tasks on one scale (MISSING is the abstention, near 1 for a policy
  that abstains), so the IQM here trims runs of the recomposed accuracy. Without relation scores for every run:
  a plain bootstrap of the runs.
- `probability_of_improvement(x, y)`: P(X > Y) + 0.5 P(X = Y) for a run X of the condition and a run Y of the
  baseline, both drawn at random: the Mann-Whitney U statistic of x against y divided by n m (rliable's
  `probability_of_improvement` for one task; the tests check it against scipy.stats.mannwhitneyu). 0.5: no
  tendency either way. Unpaired: the statistic of two independent samples of runs, as in rliable (the per-seed
  pairing is used by the paired bootstraps). Interval: 95% percentile bootstrap resampling x and y independently.
- `performance_profile(x, taus)`: the fraction of runs whose score is above tau, for every tau (rliable's run-score
  distribution, drawn by harness.report.plots.performance_profile).

Every bootstrap: ROBUST_RESAMPLES replicates from numpy.random.default_rng(ROBUST_SEED), inverted-CDF quantiles
(harness.report.stats). Deterministic.
"""

from __future__ import annotations

import numpy as np

from harness.report.stats import percentile_interval

ROBUST_RESAMPLES = 2000
ROBUST_SEED = 0
TRIM = 0.25  # the interquartile mean: a quarter of the runs off each end


def iqm(x) -> float:
    """Mean of the runs left after dropping floor(n * TRIM) at each end of the sorted scores. (...,) -> ()"""
    v = np.sort(np.asarray(x, dtype=float).ravel())
    k = int(TRIM * v.size)
    return float(v[k:v.size - k].mean())


def _iqm_rows(m: np.ndarray) -> np.ndarray:
    """IQM of every row of m (R, n) at once. -> (R,)"""
    v = np.sort(m, axis=1)
    k = int(TRIM * v.shape[1])
    return v[:, k:v.shape[1] - k].mean(axis=1)


def stratified_iqm(scores, weights=None, *, resamples: int = ROBUST_RESAMPLES, seed: int = ROBUST_SEED) -> dict:
    """IQM over runs and its stratified bootstrap interval (module docstring).

    scores: (n,) one score per run (plain bootstrap), or (n, S) a score per run and stratum with weights (S,) summing
    to 1 (stratified). Returns {"n", "iqm", "low", "high", "strata" (S or 0), "resamples", "rng_seed"}; one run: no
    interval."""
    s = np.asarray(scores, dtype=float)
    strata = s.ndim == 2
    w = np.asarray(weights, dtype=float) if strata else None
    per_run = s @ w if strata else s  # (n,) each run's score
    n = int(per_run.size)
    out = {"n": n, "iqm": iqm(per_run) if n else None, "low": None, "high": None, "strata": s.shape[1] if strata else 0,
           "resamples": resamples, "rng_seed": seed}
    if n < 2:
        return out
    rng = np.random.default_rng(seed)
    if strata:
        idx = rng.integers(0, n, size=(resamples, n, s.shape[1]))  # (R, n, S): runs drawn per stratum
        reps = s[idx, np.arange(s.shape[1])] @ w  # (R, n, S) -> (R, n): each resampled run rebuilt
    else:
        reps = per_run[rng.integers(0, n, size=(resamples, n))]  # (R, n)
    out["low"], out["high"] = percentile_interval(_iqm_rows(reps))
    return out


def _poi_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + 0.5 P(X = Y) of every replicate: x (R, n), y (R, m) -> (R,)"""
    gt = (x[:, :, None] > y[:, None, :]).mean(axis=(1, 2))
    eq = (x[:, :, None] == y[:, None, :]).mean(axis=(1, 2))
    return gt + 0.5 * eq


def probability_of_improvement(x, y, *, resamples: int = ROBUST_RESAMPLES, seed: int = ROBUST_SEED) -> dict:
    """{"n", "m", "p", "low", "high", ...}: P(X > Y) + 0.5 P(X = Y) of the condition's runs x over the baseline's y
    (module docstring); with one run on either side, no interval."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    out = {"n": int(a.size), "m": int(b.size), "p": None, "low": None, "high": None, "resamples": resamples,
           "rng_seed": seed}
    if not a.size or not b.size:
        return out
    out["p"] = float(_poi_rows(a[None], b[None])[0])
    if a.size < 2 or b.size < 2:
        return out
    rng = np.random.default_rng(seed)
    xa = a[rng.integers(0, a.size, size=(resamples, a.size))]  # (R, n)
    yb = b[rng.integers(0, b.size, size=(resamples, b.size))]  # (R, m)
    out["low"], out["high"] = percentile_interval(_poi_rows(xa, yb))
    return out


def performance_profile(x, taus) -> np.ndarray:
    """Fraction of runs with score > tau, for each tau. (n,), (T,) -> (T,)"""
    v = np.asarray(x, dtype=float)
    return (v[None, :] > np.asarray(taus, dtype=float)[:, None]).mean(axis=1)
