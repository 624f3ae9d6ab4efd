"""Efficiency per sampled token, from the eval curve of each run: held-out accuracy at 0 tokens (eval before), at
each periodic eval (train.eval_steps) and at the run's last token (final eval) (harness.report.runs.read_eval_curve).
numpy + scipy.

- `auc(x, y, lo, hi)`: the area under accuracy vs sampled tokens over the group's common token range [lo, hi]
  (lo: the latest first point, hi: the earliest last point of the group's runs, so every run covers it and arms
  compare over the same tokens), by the trapezoid rule between the run's points (linear in between: the ends
  interpolated), divided by hi - lo: the run's mean accuracy over the range, in accuracy units. Over seeds: the mean
  and its 95% t interval (harness.report.stats.mean_ci).
- `tokens_to(x, y, tau)`: the sampled tokens at which the run first reaches accuracy tau, linear between the two
  eval points around the first crossing; None: not reached by the run's last eval. The report's tau (`threshold`):
  half-way from the init's accuracy (mean eval before over the group's runs) to the best condition's mean final
  accuracy, i.e. half of the largest gain; none when no condition gains.
- `fit_scalerl(curves)`: ScaleRL's saturating curve of reward against compute (Khatri et al. 2025, "The Art of
  Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786, eq. 1), with sampled tokens as compute C:

      R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

  A: the asymptote (the accuracy the recipe saturates at), B > 0: the compute efficiency (how sharply it
  approaches A), C_mid: the tokens at which half the gain A - R0 is reached. R0 is the condition's mean accuracy at
  0 tokens (its eval before; as ScaleRL fixes R0 to the initial reward); without one, R0 is fitted too. Fit:
  scipy.optimize.curve_fit (trust region, bounds A in [0, 1], B in [B_MIN, B_MAX], C_mid in
  [min C / 10, 10 max C], log C_mid as the parameter) on every point of every seed, pooled. Intervals for A and B:
  the 95% percentile interval of FIT_RESAMPLES refits on seeds resampled with replacement
  (numpy.random.default_rng(FIT_SEED); a seed's points travel together).
  Not identifiable (said, with its reason, instead of numbers): fewer than MIN_POINTS distinct token counts per run
  (0 included); the fit fails or its covariance is not finite; A, B or C_mid ends at a bound (no curvature: a
  straight line is fitted by an asymptote beyond the data); more than MAX_BAD_REFITS of the refits fail or end at a
  bound (the intervals are unbounded).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from harness.report.stats import percentile_interval

MIN_POINTS = 4
B_MIN, B_MAX = 0.1, 10.0
C_SPAN = 10.0  # C_mid within [min C / C_SPAN, C_SPAN * max C]
AT_BOUND = 1e-3  # a parameter within this fraction of its range from a bound is at the bound
FIT_RESAMPLES = 200
FIT_SEED = 0
MAX_BAD_REFITS = 0.1
THRESHOLD_FRACTION = 0.5


# --- area under the curve and tokens to a threshold


def common_range(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float] | None:
    """[latest first token, earliest last token] of the curves; None when empty or without width."""
    if not curves:
        return None
    lo, hi = max(float(x[0]) for x, _ in curves), min(float(x[-1]) for x, _ in curves)
    return (lo, hi) if hi > lo else None


def auc(x, y, lo: float, hi: float) -> float:
    """Trapezoid area under y(x) over [lo, hi] (linear between points) / (hi - lo). x increasing, covering [lo, hi]."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    grid = np.unique(np.concatenate([[lo, hi], x[(x > lo) & (x < hi)]]))  # (K,) the run's points inside, the ends
    return float(np.trapezoid(np.interp(grid, x, y), grid) / (hi - lo))


def tokens_to(x, y, tau: float) -> float | None:
    """First tokens at which y reaches tau, linear between the points around the crossing; None: never."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hit = np.flatnonzero(y >= tau)
    if not hit.size:
        return None
    k = int(hit[0])
    if k == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[k - 1], x[k], y[k - 1], y[k]  # y0 < tau <= y1
    return float(x0 + (tau - y0) * (x1 - x0) / (y1 - y0))


def default_threshold(inits: list[float], finals: list[float]) -> float | None:
    """init + THRESHOLD_FRACTION * (best final - init): inits, the runs' accuracies at 0 tokens; finals, each
    condition's mean final accuracy. None without an init or a gain."""
    if not inits or not finals:
        return None
    init = float(np.mean(inits))
    gain = max(finals) - init
    return init + THRESHOLD_FRACTION * gain if gain > 0 else None


# --- the ScaleRL curve


def scalerl(c, r0: float, a: float, b: float, c_mid: float):
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore"):
        return r0 + (a - r0) / (1.0 + (c_mid / c) ** b)


def _fit(x: np.ndarray, y: np.ndarray, r0: float | None, cmin: float, cmax: float,
         p0: list[float] | None = None) -> tuple[dict | None, str | None]:
    """One least-squares fit on the points with C > 0: ({"A", "B", "C_mid", "R0"}, None) or (None, why)."""
    lo_c, hi_c = math.log(cmin / C_SPAN), math.log(cmax * C_SPAN)
    lower, upper = [0.0, B_MIN, lo_c], [1.0, B_MAX, hi_c]
    if r0 is None:  # no eval at 0 tokens: R0 is a parameter too
        lower, upper = [0.0] + lower, [1.0] + upper
    if p0 is None:
        p0 = [min(max(float(y.max()), 0.05), 0.95), 1.0, math.log(float(np.median(x)))]
        p0 = ([min(max(float(y.min()), 0.05), 0.95)] if r0 is None else []) + p0

    def f(c, *p):
        return scalerl(c, r0 if r0 is not None else p[0], *p[-3:-1], math.exp(p[-1]))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OptimizeWarning)  # a covariance that cannot be estimated: not identified
            p, cov = curve_fit(f, x, y, p0=p0, bounds=(lower, upper), method="trf", maxfev=5000)
    except (RuntimeError, ValueError, OptimizeWarning) as exc:
        return None, f"the fit failed ({type(exc).__name__})"
    if not np.all(np.isfinite(cov)):
        return None, "the fit's covariance is not finite"
    at = [name for name, v, lo, hi in zip(("R0", "A", "B", "C_mid")[-len(p):], p, lower, upper)
          if min(v - lo, hi - v) <= AT_BOUND * (hi - lo)]
    fit = {"R0": float(p[0]) if r0 is None else r0, "A": float(p[-3]), "B": float(p[-2]),
           "C_mid": float(math.exp(p[-1])), "p": [float(v) for v in p]}
    if at:
        return fit, f"{' and '.join(at)} at a bound of the fit (no curvature in the points: the asymptote is not " \
                    "in reach of the data)"
    return fit, None


def _pooled(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, float | None]:
    """(C > 0 points, their accuracies, mean accuracy at C = 0 or None) of the seeds' curves pooled."""
    x = np.concatenate([c[0] for c in curves])
    y = np.concatenate([c[1] for c in curves])
    zero = x == 0
    return x[~zero], y[~zero], (float(y[zero].mean()) if zero.any() else None)


def fit_scalerl(curves: list[tuple[np.ndarray, np.ndarray]], *, resamples: int = FIT_RESAMPLES,
                seed: int = FIT_SEED) -> dict:
    """The ScaleRL fit of one condition's seeds' curves [(tokens (K,), accuracy (K,))] (module docstring):
    {"identifiable", "reason", "points", "seeds", "A", "B", "C_mid", "R0", "A_interval", "B_interval", ...}."""
    points = min((len(np.unique(x)) for x, _ in curves), default=0)
    out = {"identifiable": False, "reason": None, "points": points, "seeds": len(curves), "A": None, "B": None,
           "C_mid": None, "R0": None, "A_interval": None, "B_interval": None, "resamples": resamples,
           "rng_seed": seed, "bad_refits": None}
    if points < MIN_POINTS:
        out["reason"] = (f"too few points: {points} distinct token counts per run, the fit needs {MIN_POINTS} "
                         "(train.eval_steps adds periodic evals)")
        return out
    x, y, r0 = _pooled(curves)
    cmin, cmax = float(x.min()), float(x.max())
    fit, why = _fit(x, y, r0, cmin, cmax)
    if fit is not None:
        out.update({k: fit[k] for k in ("A", "B", "C_mid", "R0")})
    if why:
        out["reason"] = why
        return out
    if len(curves) > 1:
        rng = np.random.default_rng(seed)
        a_s, b_s, bad = [], [], 0
        for _ in range(resamples):
            xb, yb, r0b = _pooled([curves[i] for i in rng.integers(0, len(curves), size=len(curves))])
            refit, why_b = _fit(xb, yb, r0b, cmin, cmax, p0=fit["p"])
            if refit is None or why_b:
                bad += 1
                continue
            a_s.append(refit["A"])
            b_s.append(refit["B"])
        out["bad_refits"] = bad
        if bad > MAX_BAD_REFITS * resamples:
            out["reason"] = (f"{bad} of {resamples} refits on resampled seeds failed or ended at a bound: the "
                             "intervals of A and B are unbounded")
            return out
        out["A_interval"], out["B_interval"] = list(percentile_interval(a_s)), list(percentile_interval(b_s))
    out["identifiable"] = True
    return out
