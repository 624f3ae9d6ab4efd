"""The statistics a reviewer asks for, per group of the report (report.json `groups[]`): the per-item paired interval
and the seeds and items needed beside every paired row, robust aggregates over seeds, efficiency per sampled token.
The mathematics lives in itemstats, power, robust and efficiency; this module picks the numbers out of the runs.

- Paired rows (`compare.paired`) gain `item` (the hierarchical bootstrap over seeds, then views paired by view id:
  eval accuracy overall and per relation, from each seed's eval/<split>.predictions.jsonl) and `power` (`seeds`:
  the seeds a paired t-test needs to detect the observed mean difference at 80% power from the per-seed
  differences; `items`: the views per eval it needs from the per-view differences averaged over the paired seeds).
- `robust`: per condition, the IQM of the eval accuracy over seeds with its stratified bootstrap interval (strata:
  the eval's relations) and the probability of improvement over the baseline.
- `efficiency`: per RL condition, the area under accuracy vs sampled tokens, the tokens to a threshold, and the
  ScaleRL fit's A and B (or why they are not identifiable).
"""

from __future__ import annotations

import numpy as np

from harness.report.compare import Condition, Group, kind
from harness.report.efficiency import auc, common_range, default_threshold, fit_scalerl, tokens_to
from harness.report.itemstats import hierarchical_bootstrap, item_differences
from harness.metrics import RELATIONS
from harness.report.power import needed
from harness.report.robust import probability_of_improvement, stratified_iqm
from harness.report.runs import Run, read_items
from harness.report.stats import mean_ci

#: paired metric -> the relation whose views it scores (None: every view)
ITEM_METRICS = {"eval/accuracy": None, **{f"eval/{rel}/accuracy": rel for rel in RELATIONS}}
ROBUST_METRIC = "eval/accuracy"


def _run(cond: Condition, seed) -> Run | None:
    return next((r for r in cond.runs if r.seed == seed), None)


def _scores(run: Run | None, relation: str | None) -> dict[str, float]:
    if run is None:
        return {}
    return {v: s for v, (s, rel) in read_items(run).items() if relation is None or rel == relation}


def add_item_and_power(group: Group) -> None:
    """Every paired row of the group gains `item` (None when no paired seed has predictions on both sides) and
    `power` (module docstring)."""
    by_label = {c.label: c for c in group.conditions}
    for p in group.paired:
        p["power"] = {"seeds": needed(p["diffs"]), "items": None}
        p["item"] = None
        if p["metric"] not in ITEM_METRICS or group.baseline is None:
            continue
        rel, cond = ITEM_METRICS[p["metric"]], by_label[p["condition"]]
        a, b, seeds, missing = [], [], [], []
        for seed in p["seeds"]:
            sa, sb = _scores(_run(cond, seed), rel), _scores(_run(group.baseline, seed), rel)
            if sa and sb:
                a.append(sa)
                b.append(sb)
                seeds.append(seed)
            else:
                missing.append(seed)
        if not seeds:
            continue
        p["item"] = {**hierarchical_bootstrap(a, b), "seeds": seeds, "seeds_without_predictions": missing}
        p["power"]["items"] = needed(item_differences(a, b))


# --- robust aggregates


def _strata(runs: list[Run]) -> tuple[np.ndarray, np.ndarray] | None:
    """((runs, relations) accuracies, (relations,) view shares) when every run's eval has every relation's accuracy
    and view count, the counts agree, and the view-weighted accuracies rebuild the run's accuracy; else None."""
    rows, counts = [], set()
    for r in runs:
        per = (r.eval_after or {}).get("per_relation") or {}
        try:
            rows.append([float(per[rel]["accuracy"]) for rel in RELATIONS])
            counts.add(tuple(int(per[rel]["n"]) for rel in RELATIONS))
        except (KeyError, TypeError, ValueError):
            return None
    if len(counts) != 1 or not sum(next(iter(counts))):
        return None
    n = np.array(next(iter(counts)), dtype=float)
    s, w = np.array(rows), n / n.sum()
    overall = np.array([r.metrics[ROBUST_METRIC] for r in runs])
    return (s, w) if np.allclose(s @ w, overall, atol=1e-6) else None


def robust(group: Group) -> dict:
    """report.json group `robust` (module docstring)."""
    base = group.baseline
    base_runs = [r for r in base.runs if r.metrics.get(ROBUST_METRIC) is not None] if base else []
    rows = []
    for c in group.conditions:
        runs = [r for r in c.runs if r.metrics.get(ROBUST_METRIC) is not None]
        if not runs:
            continue
        strata = _strata(runs)
        x = [r.metrics[ROBUST_METRIC] for r in runs]
        row = {"condition": c.label, "seeds": [r.seed for r in runs],
               "iqm": stratified_iqm(*strata) if strata else stratified_iqm(x),
               "strata": list(RELATIONS) if strata else None, "improvement": None}
        if base is not None and c is not base and base_runs and not (kind(c) == "loss" and kind(base) == "sampled"):
            row["improvement"] = probability_of_improvement(x, [r.metrics[ROBUST_METRIC] for r in base_runs])
        rows.append(row)
    return {"metric": ROBUST_METRIC, "baseline": base.label if base else None, "conditions": rows}


def profile_scores(group: Group) -> dict[str, list[float]]:
    """Each condition's per-run eval accuracy (the performance profile's runs)."""
    out = {c.label: [r.metrics[ROBUST_METRIC] for r in c.runs if r.metrics.get(ROBUST_METRIC) is not None]
           for c in group.conditions}
    return {k: v for k, v in out.items() if v}


# --- efficiency per sampled token


def _curve(run: Run) -> tuple[np.ndarray, np.ndarray]:
    pts = sorted((p["tokens"], p["accuracy"]) for p in run.eval_curve if p.get("accuracy") is not None)
    x, y = (np.array(v, dtype=float) for v in zip(*pts))
    return x, y


def efficiency(group: Group, threshold: float | None = None) -> dict:
    """report.json group `efficiency` (module docstring); `threshold`: the accuracy to reach (None: the default
    rule of harness.report.efficiency.default_threshold)."""
    conds = [(c, [(r, _curve(r)) for r in c.runs if len(r.eval_curve) >= 2]) for c in group.conditions if c.rl]
    conds = [(c, runs) for c, runs in conds if runs]
    every = [xy for _, runs in conds for _, xy in runs]
    span = common_range(every)
    inits = [float(y[0]) for x, y in every if x[0] == 0]
    finals = [float(np.mean([y[-1] for _, (x, y) in runs])) for _, runs in conds]
    rule = "given (--threshold)" if threshold is not None else "half-way from the init to the best final accuracy"
    tau = threshold if threshold is not None else default_threshold(inits, finals)
    rows = []
    for c, runs in conds:
        aucs = [auc(x, y, *span) for _, (x, y) in runs] if span else []
        reach = [tokens_to(x, y, tau) if tau is not None else None for _, (x, y) in runs]
        row = {"condition": c.label, "seeds": [r.seed for r, _ in runs],
               "auc": {**mean_ci(aucs), "values": aucs},
               "tokens_to_threshold": {"values": reach, "reached": sum(v is not None for v in reach),
                                       "n": len(runs), "summary": mean_ci(reach) if None not in reach else None},
               "fit": fit_scalerl([xy for _, xy in runs])}
        rows.append(row)
    return {"range": list(span) if span else None, "threshold": tau, "threshold_rule": rule,
            "init_accuracy": float(np.mean(inits)) if inits else None, "conditions": rows}


def group_statistics(group: Group, threshold: float | None = None) -> dict:
    """Adds `item` and `power` to the group's paired rows; returns {"robust", "efficiency"} for report.json."""
    add_item_and_power(group)
    return {"robust": robust(group), "efficiency": efficiency(group, threshold)}
