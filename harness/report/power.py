"""How many seeds (and items) would tell two conditions apart: the power of a paired t-test. scipy.stats.

Given the observed paired differences d_1..d_n (per seed, or per item), with mean d and sample sd s (ddof=1), the
standardized effect is delta = d / s (Cohen's d_z for paired samples). A two-sided paired t-test at level alpha
rejects when |T| > t_{1-alpha/2, N-1}; with N pairs, T follows the noncentral t with N-1 degrees of freedom and
noncentrality delta * sqrt(N), so its power is

    power(N) = 1 - F_nct(t_crit; N-1, delta sqrt(N)) + F_nct(-t_crit; N-1, delta sqrt(N))

(Cohen 1988, ch. 2; the same as G*Power's "t tests - means: difference from constant (one sample case)"). The
number needed is the smallest N >= 2 with power(N) >= POWER (0.80) at ALPHA (0.05); the search starts at the
normal approximation N ~ ((z_{1-alpha/2} + z_{power}) / delta)^2 and steps by one (power grows with N). Worked
check (Cohen 1988, Table 2.4.1 / G*Power): delta = 0.5 needs 34 pairs (power 0.808); the normal approximation
says 31.4, and Guenther's (1981) t correction adds z_{1-alpha/2}^2 / 2 = 1.92, giving 33.3.

It treats the observed mean and sd as the true ones: a planning number for the next run, not a test of this one
(the "observed power" of the data at hand says nothing beyond its p-value: Hoenig & Heisey 2001).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
POWER = 0.80
N_MAX = 10**7  # beyond: "more than N_MAX" (an effect this small is no difference a run can show)


def t_test_power(delta: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided one-sample (paired) t-test with n pairs at standardized effect delta."""
    df = n - 1
    crit = sps.t.ppf(1.0 - alpha / 2, df)
    nc = abs(delta) * math.sqrt(n)
    return float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))


def normal_approx_n(delta: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """((z_{1-alpha/2} + z_{power}) / delta)^2: the pairs a z-test (known sd) would need."""
    z = sps.norm.ppf(1.0 - alpha / 2) + sps.norm.ppf(power)
    return float((z / abs(delta)) ** 2)


def n_for_power(delta: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """The smallest n >= 2 with t_test_power(delta, n) >= power; None when delta is 0 or n would pass N_MAX."""
    if delta == 0 or not math.isfinite(delta):
        return 2 if math.isinf(delta) else None
    approx = normal_approx_n(delta, alpha, power)
    if approx > N_MAX:
        return None
    n = max(2, int(approx))  # the t-test needs at least the z-test's pairs
    while t_test_power(delta, n, alpha) < power:
        n += 1
    while n > 2 and t_test_power(delta, n - 1, alpha) >= power:
        n -= 1
    return n


def needed(diffs, alpha: float = ALPHA, power: float = POWER) -> dict:
    """From observed paired differences: {"n", "mean", "sd", "effect" (mean / sd), "needed"}; `needed` None when the
    mean difference is 0 (no number of pairs detects it) or fewer than 2 differences (no sd). sd 0 with a nonzero
    mean: the smallest test (2 pairs)."""
    d = np.asarray([x for x in diffs if x is not None], dtype=float)
    out = {"n": int(d.size), "mean": float(d.mean()) if d.size else None, "sd": None, "effect": None,
           "needed": None, "alpha": alpha, "power": power}
    if d.size < 2:
        return out
    sd = float(d.std(ddof=1))  # the sample sd of the differences: the t-test's estimator
    mean = float(d.mean())
    out["sd"] = sd
    if mean == 0.0:
        return out
    delta = mean / sd if sd > 0 else math.copysign(math.inf, mean)
    out["effect"] = delta if math.isfinite(delta) else None
    out["needed"] = n_for_power(delta, alpha, power)
    return out
