"""report.json -> the markdown of the reviewer's statistics (harness.report.analysis): the per-item column of the
paired table and the seeds and items needed under it, robust aggregates over seeds, efficiency per sampled token.
harness.report.render calls these; every number comes from report.json."""

from __future__ import annotations

from harness.report.efficiency import B_MAX, B_MIN, FIT_RESAMPLES, FIT_SEED, MIN_POINTS
from harness.report.itemstats import HB_RESAMPLES, HB_SEED
from harness.report.mdtable import table as _table
from harness.metrics import METRIC_TITLES
from harness.report.power import ALPHA, POWER
from harness.report.robust import ROBUST_RESAMPLES, ROBUST_SEED

DASH = "–"


def _acc(v: float | None, signed: bool = False) -> str:
    return DASH if v is None else f"{v:{'+' if signed else ''}.3f}"


def _interval(lo: float | None, hi: float | None, signed: bool = False) -> str:
    return f"[{_acc(lo, signed)}, {_acc(hi, signed)}]" if lo is not None else "no interval"


def _tokens(v: float | None) -> str:
    return DASH if v is None else f"{v:,.0f}"


def _count(n: int | None) -> str:
    return "never (mean difference 0)" if n is None else f"{n:,}"


# --- the paired table


def item_text() -> str:
    """The paired section's sentence on the per-item column."""
    return ("Per item: the same difference from every view of the eval, paired by view id, by a hierarchical "
            "bootstrap: seeds resampled (both arms at once), then the views within each drawn seed (the same views "
            f"for both arms), {HB_RESAMPLES:,} replicates from numpy default_rng({HB_SEED}); a view hard for both "
            "arms cancels in the difference, so this interval is narrower than the seeds' one when the views vary "
            "in difficulty more than the arms differ. From eval/<split>.predictions.jsonl; `–` for a metric that "
            "is not a mean over views, or without predictions.")


def item_cell(p: dict) -> str:
    item = p.get("item")
    if not item or item.get("mean") is None:
        return DASH
    views = sorted(set(item["n_items"]))
    per = f"{views[0]:,}" if len(views) == 1 else f"{views[0]:,}–{views[-1]:,}"
    return f"{_interval(item['low'], item['high'], True)} ({item['n_seeds']} seeds × {per} views)"


def _contains_zero(lo: float | None, hi: float | None) -> bool:
    return lo is None or lo <= 0.0 <= hi


def power_lines(g: dict) -> list[str]:
    """Under the paired table: the rows whose interval over seeds contains 0 (not distinguishable), with the seeds
    (and views) a paired t-test would need to detect the observed mean difference."""
    rows = []
    for p in g.get("paired") or []:
        pw = (p.get("power") or {}).get("seeds")
        if not pw or p["n"] < 2 or not _contains_zero(p["low"], p["high"]) or not any(p["diffs"]):
            continue  # one seed, a distinguishable difference, or 0 on every seed (nothing to detect)
        items = (p.get("power") or {}).get("items")
        item = p.get("item") or {}
        per_item = (DASH if item.get("mean") is None else
                    "contains 0" if _contains_zero(item["low"], item["high"]) else "excludes 0")
        rows.append([p["condition"], METRIC_TITLES[p["metric"]], _acc(p["mean"], True), _acc(pw["sd"]),
                     str(p["n"]), _count(pw["needed"]), per_item,
                     _count(items["needed"]) if items and items["n"] >= 2 else DASH])
    if not rows:
        return []
    return ["", f"**Not distinguishable** (the 95% interval over seeds contains 0). Seeds needed: the number of "
            f"paired seeds at which a two-sided paired t-test (alpha {ALPHA}) detects the observed mean difference "
            f"with {POWER:.0%} power, taking the observed mean and sd of the per-seed differences d_s as the truth "
            "(noncentral t, scipy.stats.nct; a planning number, not a test of these runs). Views needed: the same "
            "from the per-view differences averaged over the paired seeds (the eval's size at these seeds, if the "
            "views were the only noise).", ""] + _table(
        ["condition", "metric", "mean difference", "sd of d_s", "seeds now", "seeds needed",
         "per-item interval", "views needed"], rows)


# --- robust aggregates


def robust_section(g: dict, h: str) -> list[str]:
    r = g.get("robust") or {}
    if not r.get("conditions"):
        return []
    base = r.get("baseline")
    out = ["", f"{h} Robust aggregates over seeds (rliable)", "",
           "After Agarwal et al. 2021 (rliable). IQM: interquartile mean of the runs' eval accuracy (the mean of the "
           "middle 50% of seeds: floor(n/4) dropped at each end, scipy.stats.trim_mean(x, 0.25)); its 95% interval "
           "by a stratified bootstrap: the runs resampled within each relation (FULL, CONTROL, MISSING, SUBSTITUTE) "
           "independently and each resampled run's accuracy rebuilt from its relations by their share of the views "
           "(`plain`: runs resampled whole, where a run lacks relation scores). "
           + (f"P(improvement): the probability that a random run of the condition scores above a random run of "
              f"the baseline `{base}`, ties counted half (Mann–Whitney U / (n m)); 0.5 = no tendency; unpaired; "
              "interval: runs of both resampled independently. " if base else "")
           + f"{ROBUST_RESAMPLES:,} replicates from numpy default_rng({ROBUST_SEED}), percentile intervals.", ""]
    rows = []
    for c in r["conditions"]:
        iqm, imp = c["iqm"], c.get("improvement")
        rows.append([c["condition"], str(iqm["n"]), _acc(iqm["iqm"]), _interval(iqm["low"], iqm["high"]),
                     "relations" if c["strata"] else "plain",
                     (f"{imp['p']:.2f} [{imp['low']:.2f}, {imp['high']:.2f}]" if imp and imp["low"] is not None
                      else f"{imp['p']:.2f} (no interval)" if imp and imp["p"] is not None
                      else "baseline" if c["condition"] == base else DASH)])
    out += _table(["condition", "seeds", "IQM accuracy", "95% interval", "strata",
                   f"P(improvement over `{base}`)" if base else "P(improvement)"], rows)
    return out


# --- efficiency per sampled token


def _fit_cells(f: dict) -> list[str]:
    if not f["identifiable"]:
        return [DASH, DASH, "not identifiable: " + f["reason"]]
    a_int = f" {_interval(*f['A_interval'])}" if f.get("A_interval") else " (one seed: no interval)"
    b_int = f" [{f['B_interval'][0]:.2f}, {f['B_interval'][1]:.2f}]" if f.get("B_interval") else ""
    return [f"{f['A']:.3f}{a_int}", f"{f['B']:.2f}{b_int}", f"C_mid {_tokens(f['C_mid'])} tokens, R0 {f['R0']:.3f}"]


def _reach_cell(t: dict) -> str:
    if t["summary"] is not None and t["summary"]["n"] >= 3:
        return f"{_tokens(t['summary']['mean'])} ± {_tokens(t['summary']['half_width'])} (n={t['n']})"
    vals = ", ".join("not reached" if v is None else _tokens(v) for v in t["values"])
    return f"{t['reached']} of {t['n']} reached: {vals}"


def efficiency_section(g: dict, h: str) -> list[str]:
    e = g.get("efficiency") or {}
    if not e.get("conditions"):
        return []
    span, tau = e.get("range"), e.get("threshold")
    out = ["", f"{h} Efficiency per sampled token", "",
           "From each RL run's eval curve (eval before at 0 tokens, the periodic evals of train.eval_steps, the final "
           "eval). AUC: the area under accuracy vs sampled tokens over the tokens every run of the group covers "
           + (f"({_tokens(span[0])} to {_tokens(span[1])})" if span else "(none: no common range)")
           + ", trapezoid between eval points, divided by that range: the run's mean accuracy over it; mean ± 95% t "
           "interval over seeds. Tokens to "
           + (f"accuracy {tau:.3f} ({e['threshold_rule']}" + (f"; init {e['init_accuracy']:.3f}" if
                                                              e.get("init_accuracy") is not None else "") + ")"
              if tau is not None else "a threshold: no threshold (no condition gains over its init)")
           + ": the first crossing, linear between the eval points around it. A and B: the ScaleRL curve "
           "R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (Khatri et al. 2025, arXiv 2510.13786) fitted to every "
           "eval point of the condition's seeds (scipy curve_fit, A in [0, 1], B in "
           f"[{B_MIN}, {B_MAX}]); A, the asymptote, and B, the efficiency, with 95% percentile intervals of "
           f"{FIT_RESAMPLES} refits on resampled seeds (default_rng({FIT_SEED})). Not identifiable: fewer than "
           f"{MIN_POINTS} eval points per run, a failed fit, a parameter at its bound (no curvature), or more than "
           "10% of the refits so.", ""]
    rows = []
    for c in e["conditions"]:
        a = c["auc"]
        auc = (DASH if a["mean"] is None else f"{a['mean']:.3f} ± {a['half_width']:.3f} (n={a['n']})"
               if a["half_width"] is not None and a["n"] >= 3 else f"{a['mean']:.3f} (n={a['n']})")
        rows.append([c["condition"], auc, _reach_cell(c["tokens_to_threshold"]) if tau is not None else DASH]
                    + _fit_cells(c["fit"]))
    out += _table(["condition", "AUC (mean accuracy over the range)",
                   f"tokens to {tau:.3f}" if tau is not None else "tokens to threshold",
                   "A (asymptote)", "B (efficiency)", "fit"], rows)
    return out
