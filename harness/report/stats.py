"""Statistics over seeds: Student-t intervals and a paired percentile bootstrap. numpy + scipy.stats.

- `mean_ci(values)`: mean and the half-width of the two-sided 95% Student-t interval,
  t_{0.975, n-1} * sd / sqrt(n) with sd the sample standard deviation (ddof=1); t is
  scipy.stats.t.ppf(0.975, n - 1), exact at every df. n=1 has no interval.
- `paired_bootstrap(diffs)`: the 95% percentile bootstrap interval of the mean of per-seed
  differences. For n <= 10 it is the EXACT bootstrap distribution: every multiset of size n drawn
  from the n differences (C(2n-1, n) of them; 92,378 at n=10) with its multinomial probability
  n! / (prod_i c_i!) / n^n: no Monte Carlo error, where a resampling bootstrap of 5 seeds has one
  (tests/unit/test_report_stats.py checks it against scipy.stats.bootstrap). Beyond 10 it is Monte
  Carlo: 10,000 resamples from numpy.random.default_rng(0). Both are deterministic.
- Quantile rule (every bootstrap of the report): the inverted CDF, i.e. the q-quantile is the smallest
  resampled value m with P(value <= m) >= q (numpy's method="inverted_cdf" for equal weights). The
  interval is [Q(0.025), Q(0.975)]. Hand check, n=2 (d1 < d2): means d1, (d1+d2)/2, d2 with
  probabilities 1/4, 1/2, 1/4, so the CDF is 0.25, 0.75, 1 and the interval is [d1, d2].
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

EXACT_MAX = 10
MC_RESAMPLES = 10_000
MC_SEED = 0
LEVEL = 0.95


def t975(df: int) -> float:
    """t_{0.975, df}, the two-sided 95% Student-t quantile (scipy.stats.t)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(sps.t.ppf(1.0 - (1.0 - LEVEL) / 2, df))


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    """[Q(0.025), Q(0.975)] of equally likely bootstrap replicates, by the inverted-CDF rule (module docstring).
    Non-finite replicates (a statistic undefined on a resample) are dropped by the caller, not here."""
    v = np.asarray(samples, dtype=float)
    w = np.ones_like(v)
    alpha = (1.0 - LEVEL) / 2  # 0.025000000000000022 in floats: weighted_quantile's tolerance keeps it 2.5%
    return weighted_quantile(v, w, alpha), weighted_quantile(v, w, 1.0 - alpha)


def mean_ci(values: list[float]) -> dict:
    """{"n", "mean", "sd", "t", "half_width"}; sd/t/half_width are None when n < 2, mean None when n = 0."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    n = int(x.size)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "t": None, "half_width": None}
    mean = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "t": None, "half_width": None}
    sd = float(x.std(ddof=1))  # sample sd: the t interval's estimator
    t = t975(n - 1)
    return {"n": n, "mean": mean, "sd": sd, "t": t, "half_width": t * sd / math.sqrt(n)}


# --- paired bootstrap


@lru_cache(maxsize=EXACT_MAX + 1)
def multisets(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts (M, n), probabilities (M,)) of every size-n multiset of n items, M = C(2n-1, n).

    Row k gives how often each of the n items is drawn; its probability under n draws with
    replacement is the multinomial n! / prod(c_i!) / n^n. The probabilities sum to 1.
    """
    rows = [np.bincount(combo, minlength=n) for combo in itertools.combinations_with_replacement(range(n), n)]
    counts = np.asarray(rows, dtype=np.int64)  # (M, n)
    log_fact = np.array([math.lgamma(k + 1) for k in range(n + 1)])
    log_w = math.lgamma(n + 1) - log_fact[counts].sum(axis=1) - n * math.log(n)
    return counts, np.exp(log_w)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Inverted-CDF quantile: the smallest value whose cumulative probability reaches q."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cdf = np.cumsum(w) / w.sum()
    k = int(np.searchsorted(cdf, q - 1e-12, side="left"))  # tolerance: a CDF step landing exactly on q
    return float(v[min(k, v.size - 1)])


def bootstrap_means(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(resampled means, their probabilities, method) for the mean of `diffs`."""
    n = diffs.size
    if n <= EXACT_MAX:
        counts, w = multisets(n)
        return counts @ diffs / n, w, "exact"
    rng = np.random.default_rng(MC_SEED)
    idx = rng.integers(0, n, size=(MC_RESAMPLES, n))  # (R, n)
    return diffs[idx].mean(axis=1), np.full(MC_RESAMPLES, 1.0 / MC_RESAMPLES), "monte_carlo"


def paired_bootstrap(diffs: list[float]) -> dict:
    """{"n", "mean", "low", "high", "method"} of the 95% percentile bootstrap interval of mean(diffs).

    n = 0: everything None. n = 1: the difference, no interval (method "none").
    """
    d = np.asarray(diffs, dtype=float)
    n = int(d.size)
    if n == 0:
        return {"n": 0, "mean": None, "low": None, "high": None, "method": "none"}
    if n == 1:
        return {"n": 1, "mean": float(d[0]), "low": None, "high": None, "method": "none"}
    means, w, method = bootstrap_means(d)
    alpha = (1.0 - LEVEL) / 2
    return {"n": n, "mean": float(d.mean()), "low": weighted_quantile(means, w, alpha),
            "high": weighted_quantile(means, w, 1.0 - alpha), "method": method}
