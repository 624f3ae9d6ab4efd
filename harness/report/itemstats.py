"""Paired by item: a hierarchical bootstrap of the difference between two conditions on the same eval views.

Each seed's eval scores every view of the held-out split (eval/<split>.predictions.jsonl, one row per view, 720 on
the synthetic set); the per-seed paired bootstrap (harness.report.stats) keeps one number per seed and throws the
items away. Here both levels of sampling are kept:

    d_{s,i} = score(condition, seed s, view i) - score(baseline, seed s, view i)      (0/1 correct, or a float)
    estimate = mean_s mean_i d_{s,i}                     (each seed weighs the same, whatever its item count)

and one bootstrap replicate is (the hierarchical, or two-stage, bootstrap: Davison & Hinkley 1997, section 3.8;
Saravanan et al. 2020, "Application of the hierarchical bootstrap to multi-level data in neuroscience"):

    1. draw n seed slots with replacement from the n paired seeds (a seed is drawn for both arms at once: the same
       seed is the same SFT warm start, the same data order, as `compare.paired` pairs them);
    2. in every slot, draw m_s views with replacement from that seed's m_s common views, and take the mean of
       d_{s,i} over them: the SAME views for both arms (paired by view id), so a view that is hard for both arms
       moves both arms' scores together and cancels in d;
    3. the replicate is the mean over the n slots.

The interval is the 95% percentile interval of HB_RESAMPLES replicates (inverted-CDF quantiles, as every bootstrap
of the report), from numpy.random.default_rng(HB_SEED): deterministic. `paired_items=False` draws the views of the
two arms independently instead (what ignoring the item pairing would give): the report does not show it, the test
that pairing narrows the interval compares against it.

Only views both arms scored on a seed are used (a view id missing on one side is left out of that seed); seeds whose
predictions are missing on either side are left out, and the caller says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from harness.report.stats import percentile_interval

HB_RESAMPLES = 2000
HB_SEED = 0


def align(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per seed, the scores of the views both sides have, in one (sorted view id) order: [(a_s (m_s,), b_s (m_s,))];
    seeds without a common view are dropped."""
    if len(a) != len(b):
        raise ValueError(f"paired by seed: {len(a)} seeds of one condition against {len(b)} of the other; pass the "
                         "seeds both have, in the same order")
    out = []
    for sa, sb in zip(a, b):
        views = sorted(set(sa) & set(sb))
        if views:
            out.append((np.array([float(sa[v]) for v in views]), np.array([float(sb[v]) for v in views])))
    return out


def _slot_means(rng: np.random.Generator, seeds: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray]],
                paired_items: bool) -> np.ndarray:
    """(R, n) the mean item difference of every seed slot of every replicate (step 2 of the module docstring)."""
    out = np.empty(seeds.shape)
    for s, (a, b) in enumerate(pairs):
        slots = seeds == s  # (R, n) where seed s was drawn
        k, m = int(slots.sum()), a.size
        if k == 0:
            continue
        ia = rng.integers(0, m, size=(k, m))  # (k, m) views of each slot
        ib = ia if paired_items else rng.integers(0, m, size=(k, m))
        out[slots] = a[ia].mean(axis=1) - b[ib].mean(axis=1)
    return out


def replicates(pairs: list[tuple[np.ndarray, np.ndarray]], *, paired_items: bool = True,
               resamples: int = HB_RESAMPLES, seed: int = HB_SEED) -> np.ndarray:
    """(R,) bootstrap replicates of mean_s mean_i (a - b) from `align`'s pairs (steps 1-3 of the module docstring)."""
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, len(pairs), size=(resamples, len(pairs)))  # (R, n) step 1: the same seeds for both arms
    return _slot_means(rng, seeds, pairs, paired_items).mean(axis=1)  # (R, n) -> (R,) step 3


def hierarchical_bootstrap(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]], *,
                           paired_items: bool = True, resamples: int = HB_RESAMPLES, seed: int = HB_SEED) -> dict:
    """95% interval of mean_s mean_i (a - b) by resampling seeds, then views within them (module docstring).

    a[k], b[k]: the k-th paired seed's scores by view id of the condition and of the baseline. Returns {"n_seeds",
    "n_items" (common views per seed), "mean", "low", "high", "method", "resamples", "rng_seed", "paired_items"};
    one seed is resampled at the item level only; no common view: mean/low/high None."""
    pairs = align(a, b)
    out = {"n_seeds": len(pairs), "n_items": [int(x.size) for x, _ in pairs], "mean": None, "low": None,
           "high": None, "method": "hierarchical", "resamples": resamples, "rng_seed": seed,
           "paired_items": paired_items}
    if not pairs:
        return out
    out["mean"] = float(np.mean([(x - y).mean() for x, y in pairs]))  # seeds weigh the same
    reps = replicates(pairs, paired_items=paired_items, resamples=resamples, seed=seed)
    out["low"], out["high"] = percentile_interval(reps)
    return out


def item_differences(a: Sequence[Mapping[str, float]], b: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Per view present on every paired seed, its difference averaged over the seeds: the item-level sample the
    number of items needed (harness.report.power) is computed from."""
    if not a:
        return np.zeros(0)
    views = sorted(set.intersection(*(set(x) & set(y) for x, y in zip(a, b))))
    return np.array([np.mean([float(x[v]) - float(y[v]) for x, y in zip(a, b)]) for v in views])
