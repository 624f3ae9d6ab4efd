"""The report's PNG plots: matplotlib with the Agg backend, 150 dpi, written atomically.

One colour per arm everywhere (sft grey, grpo blue, papo orange, evi_po green, other arms from the
tail of tab10); conditions of one arm get shades of it, and bars a hatch. Every condition of a group also
gets its own line style, marker and line width (the first drawn widest), so that curves which coincide stay
visible: the later, thinner, dashed line runs inside the earlier one and their markers sit at different
points. Identical series are said in the legend ("lines of grpo and papo coincide"); data values are never
shifted. Legends sit outside the axes so they never cover data.
"""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display, same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from harness.report.compare import Condition, Group  # noqa: E402
from harness.report.plotstyle import (  # noqa: E402,F401  (the styles and the coincidence rule of every plot)
    ARM_COLORS,
    GRID_POINTS,
    HATCHES,
    LINESTYLES,
    MARKERS,
    Drawn,
    _and,
    _shade,
    _line_kw,
    coincide_text,
    coinciding,
    legend_handle,
    one_band,
    styles,
)
from harness.report.runs import RELATIONS  # noqa: E402
from harness.rundir import atomic_write_bytes  # noqa: E402

DPI = 150
def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _kilo(x, _pos) -> str:
    return f"{x / 1000:g}k" if abs(x) >= 1000 else f"{x:g}"


def moving_average(y: np.ndarray, w: int) -> np.ndarray:
    """Trailing mean over the last w steps (fewer at the start); steps without a reward are skipped."""
    ok = ~np.isnan(y)
    s = np.concatenate([[0.0], np.cumsum(np.where(ok, y, 0.0))])
    n = np.concatenate([[0], np.cumsum(ok)])
    lo = np.maximum(np.arange(1, y.size + 1) - w, 0)
    cnt = n[1:] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (s[1:] - s[lo]) / np.maximum(cnt, 1), np.nan)


def seed_band(ax, curves: list[tuple[np.ndarray, np.ndarray]], s: dict, label: str, lw: float = 1.8,
              legend: bool = True, marks: bool = True) -> tuple:
    """Seeds' curves (x increasing) as their mean (line) and min–max (band) over the x range every seed covers,
    linearly interpolated between each seed's own points; without a common range, each seed on its own. Returns
    the arrays drawn (for `coinciding`). `marks`: the condition's marker along the line."""
    lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if lo < hi:
        grid = np.linspace(lo, hi, GRID_POINTS)
        ys = np.vstack([np.interp(grid, x, y) for x, y in curves])  # (seeds, grid)
        ax.plot(grid, ys.mean(axis=0), label=f"{label} (n={len(curves)})" if legend else None,
                **_line_kw(s, lw, GRID_POINTS, marks))
        out = Drawn((grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)))
        if len(curves) > 1:
            out.band = ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=s["color"], alpha=0.15, lw=0)
        return out
    for k, (x, y) in enumerate(curves):
        kw = _line_kw(s, 1.2, None)
        ax.plot(x, y, marker=s["marker"], markerfacecolor="none", label=f"{label} (seed curves)" if k == 0 and legend
                else None, **kw)
    return Drawn(a for x, y in curves for a in (x, y))


# --- a. train reward vs sampled tokens


def reward_vs_tokens(group: Group, path: Path) -> dict:
    rl = [c for c in group.conditions if c.rl]
    if not rl:
        return {"file": None, "skipped": "no RL condition (no ledgers): nothing to plot"}
    st = styles(group.conditions)
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    windows: dict[str, list[int]] = {}
    drawn: dict[str, tuple] = {}
    for c in rl:
        curves = []
        for r in c.runs:
            if r.curve is None:
                continue
            x = np.cumsum(np.asarray(r.curve["tokens"], dtype=float))  # (steps,) tokens after each step
            y = np.array([np.nan if v is None else v for v in r.curve["reward"]], dtype=float)
            w = max(1, len(r.curve["step"]) // 20)
            ys = moving_average(y, w)
            keep = ~np.isnan(ys)
            if keep.any():
                curves.append((x[keep], ys[keep]))
                windows.setdefault(c.label, []).append(w)
        if curves:
            drawn[c.label] = seed_band(ax, curves, st[c.label], c.label)
    same = coinciding(drawn)
    one_band(same, drawn)
    ceilings = {r.metrics.get("budget/ceiling") for c in rl for r in c.runs}
    ceiling = ceilings.pop() if len(ceilings) == 1 else None
    right = max((float(np.sum(r.curve["tokens"])) for c in rl for r in c.runs if r.curve), default=0.0)
    if ceiling and ceiling <= 1.5 * right:
        ax.axvline(ceiling, color="black", linestyle="--", lw=1, label=f"token ceiling ({ceiling:,.0f} tokens)")
    elif ceiling:  # far beyond the data: drawing it would squeeze every curve into a corner
        ax.plot([], [], color="black", linestyle="--", lw=1,
                label=f"token ceiling: {ceiling:,.0f} tokens\n(off scale, {ceiling / right:.1f}x the largest run)")
    all_w = sorted({w for ws in windows.values() for w in ws})
    if all_w == [1]:
        wtext = "1 step (= no smoothing; window = steps//20)"
    elif len(all_w) == 1:
        wtext = f"{all_w[0]} steps (= steps//20)"
    else:
        wtext = f"steps//20 steps ({', '.join(map(str, all_w))} by run)"
    ax.set_title("Train reward vs sampled tokens\n"
                 f"moving average over {wtext}; line = mean over seeds, band = min–max over seeds\n"
                 "(overlapping bands mix their colours)", fontsize=10)
    ax.set_xlabel("cumulative sampled completion tokens (tokens, all ranks)")
    ax.set_ylabel("mean train reward per completion (reward units)")
    ax.xaxis.set_major_formatter(FuncFormatter(_kilo))
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    if same:  # one line would hide the other: say so in the legend
        ax.plot([], [], " ", label="\n".join(f"lines of {_and(s)} coincide\n(identical values)" for s in same))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _save(fig, path)
    return {"file": path.name, "windows": windows, "ceiling": ceiling, "coincide": same}


# --- b. eval accuracy per relation


def _note(fig, note: str | None) -> None:
    """A warning under the figure (the report's no-signal line), so that the PNG alone says it."""
    if note:
        fig.text(0.01, -0.01, note, ha="left", va="top", fontsize=8, color="darkred", wrap=True)


def eval_accuracy_by_relation(group: Group, path: Path, split: str, note: str | None = None) -> dict:
    keys = ["eval/accuracy"] + [f"eval/{rel}/accuracy" for rel in RELATIONS]
    cats = ["overall", *RELATIONS]
    conds = [c for c in group.conditions if c.summary["eval/accuracy"]["n"] > 0]
    if not conds:
        return {"file": None, "skipped": "no condition has an eval"}
    st = styles(group.conditions)
    fig, ax = plt.subplots(figsize=(min(16.0, 6.0 + 0.8 * len(conds)), 4.8))
    width = 0.8 / len(conds)
    base = np.arange(len(cats), dtype=float)
    for j, c in enumerate(conds):
        s = st[c.label]
        xs = base + (j - (len(conds) - 1) / 2) * width
        means = np.array([np.nan if c.summary[k]["mean"] is None else c.summary[k]["mean"] for k in keys])
        errs = np.array([c.summary[k]["half_width"] or 0.0 for k in keys])
        # Accuracy lives in [0, 1]: the t interval is drawn clipped to it (n=2 intervals are wide).
        yerr = np.vstack([np.minimum(errs, np.nan_to_num(means)), np.minimum(errs, 1 - np.nan_to_num(means))])
        ax.bar(xs, means, width * 0.95, color=s["color"], hatch=s["hatch"], edgecolor=_shade(s["color"], -0.5),
               linewidth=0.6, label=f"{c.label} (n={c.summary['eval/accuracy']['n']})")
        zero = np.nan_to_num(means, nan=1.0) == 0.0  # a bar of height 0 would not show: its colour as a line at 0
        ax.hlines(np.zeros(int(zero.sum())), xs[zero] - width * 0.45, xs[zero] + width * 0.45, colors=[s["color"]],
                  lw=3, zorder=2.5, clip_on=False)
        ax.errorbar(xs, means, yerr=yerr, fmt="none", ecolor="black", elinewidth=1, capsize=2.5)
        for x, k in zip(xs, keys):
            vals = [v["value"] for v in c.summary[k]["values"]]
            if vals:
                off = np.linspace(-0.22, 0.22, len(vals)) * width if len(vals) > 1 else np.zeros(1)
                ax.scatter(x + off, vals, s=9, color="black", zorder=3, linewidths=0, clip_on=False)
    ax.scatter([], [], s=9, color="black", label="one seed")
    ax.set_xticks(base, cats)
    ax.set_xlabel("view relation")
    ax.set_ylabel(f"greedy accuracy on {split} (fraction of views)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Eval accuracy by relation\nbar = mean over seeds, error bar = 95% t interval (clipped to [0, 1]; "
                 "none for 1 or 2 seeds), dot = one seed; a bar at 0 is a thick line on the axis", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = [i for i, lb in enumerate(labels) if lb != "one seed"] + [labels.index("one seed")]
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _note(fig, note)
    _save(fig, path)
    return {"file": path.name}


# --- c. budget use


def budget_use(group: Group, path: Path) -> dict:
    rl = [c for c in group.conditions if c.rl and c.summary["budget/fraction"]["n"] > 0]
    if not rl:
        return {"file": None, "skipped": "no RL condition: sampled-token budget not used"}
    st = styles(group.conditions)
    fig, (a1, a2) = plt.subplots(1, 2, sharey=True, figsize=(10, 1.9 + 0.55 * max(len(rl), 2)),
                                 layout="constrained")  # keeps the two-line title off the axes
    ys = np.arange(len(rl), dtype=float)
    for y, c in zip(ys, rl):
        s = st[c.label]
        for ax, key, scale in ((a1, "budget/fraction", 100.0), (a2, "train/optimizer_steps", 1.0)):
            summ = c.summary[key]
            if summ["mean"] is None:
                continue
            ax.barh(y, summ["mean"] * scale, height=0.7, color=s["color"], hatch=s["hatch"],
                    edgecolor=_shade(s["color"], -0.5), linewidth=0.6)
            vals = [v["value"] * scale for v in summ["values"]]
            off = np.linspace(-0.2, 0.2, len(vals)) if len(vals) > 1 else np.zeros(1)
            ax.scatter(vals, y + off, s=10, color="black", zorder=3, linewidths=0, clip_on=False)
    a1.axvline(100, color="black", linestyle="--", lw=1, label="ceiling (100%)")
    a1.scatter([], [], s=10, color="black", label="one seed")
    a2.legend(*a1.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    a1.set_xlim(0, max(105.0, 5 + max(v["value"] * 100 for c in rl for v in c.summary["budget/fraction"]["values"])))
    a1.set_xlabel("sampled completion tokens used (% of the run's ceiling)")
    a2.set_xlabel("optimizer steps (count)")
    a1.set_yticks(ys, [f"{c.label} (n={c.summary['budget/fraction']['n']})" for c in rl])
    a1.invert_yaxis()
    for ax in (a1, a2):
        ax.grid(axis="x", alpha=0.3)
    by_budget = any(c.summary.get("stopped_by", {}).get("budget") for c in rl)
    fig.suptitle("Budget use per RL condition: bar = mean over seeds\n"
                 + ("a run stopped by its budget ends below 100%: it stops before a step that could pass the "
                    "ceiling\n" if by_budget else "")
                 + "(SFT trains on a loss-token budget and is not shown)", fontsize=10)
    _save(fig, path)
    return {"file": path.name}


# --- d. held-out accuracy vs sampled tokens (train.eval_steps)


def accuracy_vs_tokens(group: Group, path: Path, split: str, note: str | None = None) -> dict:
    """Per RL condition, greedy held-out accuracy (overall and per relation) by the sampled tokens spent before
    it: eval before (0), the periodic evals, the final eval; mean over seeds, min–max band, each eval a dot."""
    rl = [c for c in group.conditions if c.rl and any(len(r.eval_curve) >= 2 for r in c.runs)]
    if not rl:
        return {"file": None, "skipped": "no RL run with an eval before and after training"}
    st = styles(group.conditions)
    panels = ["overall", *RELATIONS]
    fig, axes = plt.subplots(1, len(panels), sharey=True, figsize=(3.1 * len(panels) + 2.2, 3.9),
                             layout="constrained")
    inits, points = [], {}
    drawn: dict[str, dict[str, tuple]] = {panel: {} for panel in panels}
    handles = []
    for c in rl:
        s = st[c.label]
        runs = [r for r in c.runs if len(r.eval_curve) >= 2]
        points[c.label] = max(len(r.eval_curve) for r in runs)
        inits += [r.eval_curve[0]["accuracy"] for r in runs if r.eval_curve[0]["label"] == "before"]
        handles.append((legend_handle(s), f"{c.label} (n={len(runs)})"))
        for ax, panel in zip(axes, panels):
            curves = []
            for r in runs:
                pts = [(p["tokens"], p["accuracy"] if panel == "overall" else p["per_relation"].get(panel))
                       for p in r.eval_curve]
                pts = [(x, y) for x, y in pts if y is not None]
                if pts:
                    x, y = (np.array(v, dtype=float) for v in zip(*pts))
                    curves.append((x, y))
                    # each eval of each seed, with the condition's marker (hollow, larger for the earlier drawn)
                    ax.scatter(x, y, s=(3.0 + 3.0 * s["width"]) ** 2, marker=s["marker"], facecolors="none",
                               edgecolors=[s["color"]], linewidths=1.0, zorder=4 + 0.1 * s["order"], clip_on=False)
            if curves:
                drawn[panel][c.label] = seed_band(ax, curves, s, c.label, legend=False, marks=False)
    same = {panel: coinciding(d) for panel, d in drawn.items()}
    for panel, d in drawn.items():
        one_band(same[panel], d)
    init = float(np.mean(inits)) if inits else None
    teachers = teacher_accuracies(rl, split)
    for ax, panel in zip(axes, panels):
        if init is not None and panel == "overall":
            ax.axhline(init, color="black", linestyle=":", lw=1,
                       label=f"init: eval before, mean of {len(inits)} run(s) ({init:.3f})")
        for label, (acc, n, arms) in teachers.items() if panel == "overall" else ():
            ax.axhline(acc, color=st[label]["color"], linestyle="--", lw=1,
                       label=f"{label}'s teacher ({'/'.join(arms)}): final eval, mean of {n} ({acc:.3f})")
        ax.set_title(panel, fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(left=0)
        ax.xaxis.set_major_formatter(FuncFormatter(_kilo))
        ax.grid(alpha=0.3)
        ax.set_xlabel("sampled completion tokens")
    axes[0].set_ylabel(f"greedy accuracy on {split} (fraction of views)")
    for ax, panel in zip(axes, panels):
        if same[panel]:
            ax.set_title(f"{panel}  [{'; '.join(' = '.join(x) for x in same[panel])}]", fontsize=9)
    extra = list(zip(*axes[0].get_legend_handles_labels()))  # the init and teacher lines
    notes = _coincide_note(same, panels)
    if notes:
        extra.append((plt.Line2D([], [], linestyle=" "), notes))
    h, lb = zip(*(handles + extra))
    axes[-1].legend(h, lb, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    most = max(points.values())
    how = "eval before, the periodic evals (train.eval_steps) and the final eval" if most > 2 else \
        "eval before and after only (train.eval_steps=N adds the points between)"
    fig.suptitle(f"Held-out accuracy vs sampled tokens: {how}\nline = mean over seeds (linear between a seed's "
                 "evals), band = min–max over seeds, hollow marker = one eval of one seed", fontsize=10)
    _note(fig, note)
    _save(fig, path)
    return {"file": path.name, "points_per_run": points, "init_accuracy": init,
            "coincide": {panel: v for panel, v in same.items() if v},
            **({"teacher_accuracy": {k: v[0] for k, v in teachers.items()}} if teachers else {})}


def _coincide_note(same: dict[str, list[list[str]]], panels: list[str]) -> str:
    """The legend's note on identical series: 'lines of grpo and papo coincide (identical values)\nin every panel'
    (or in which); one line per set of conditions."""
    by_set: dict[tuple, list[str]] = {}
    for panel in panels:
        for labels in same.get(panel) or []:
            by_set.setdefault(tuple(labels), []).append(panel)
    out = []
    for labels, where in by_set.items():
        at = ("in every panel" if len(where) == len(panels) else
              f"in the {len(where)} panels marked\n[{' = '.join(labels)}]")
        out.append(f"lines of {_and(list(labels))} coincide\n(identical values) {at}:\ndrawn over each other")
    return "\n".join(out)


def teacher_accuracies(conditions: list[Condition], split: str) -> dict[str, tuple[float, int, list[str]]]:
    """Per condition that distills (opd: identity.teacher), its teachers' final eval accuracy on `split`: (mean over
    its runs' teachers, how many, their arms). A teacher evaluated on another split is not drawn."""
    out = {}
    for c in conditions:
        ts = [r.identity.get("teacher") or {} for r in c.runs]
        accs = [t["eval_accuracy"] for t in ts if t.get("eval_accuracy") is not None and t.get("eval_split") == split]
        if accs:
            out[c.label] = (float(np.mean(accs)), len(accs), sorted({t.get("arm") or "policy" for t in ts}))
    return out


# --- e. training diagnostics (metrics.jsonl)


# a shared panel whose quantity one arm defines its own way (said in the panel's title when that arm is shown)
PANEL_NOTES = {
    ("loss", "opd"): "opd: the divergence to the teacher, nats/token",
    ("entropy", "opd"): "opd: at its loss temperature; RL arms: at the sampling one",
}


def diagnostics(group: Group, path: Path) -> dict:
    """metrics.jsonl's training diagnostics by sampled tokens: the ones every RL arm logs (reward, loss, KL,
    entropy, grad norm, lengths, clipping) and each arm's own terms (loss/<term>, <arm>/<stat>), one panel each;
    a panel shows the conditions that logged it. Moving average over steps//20 steps; mean and min–max over seeds."""
    from harness.report.runs import SHARED_DIAGNOSTICS

    rl = [c for c in group.conditions if c.rl and any(r.diagnostics for r in c.runs)]
    if not rl:
        return {"file": None, "skipped": "no RL run with metrics.jsonl"}
    keys = sorted({k for c in rl for r in c.runs for k in r.diagnostics})
    shared = [k for k in SHARED_DIAGNOSTICS if k in keys]
    own = [k for k in keys if k not in SHARED_DIAGNOSTICS]
    panels = shared + own
    cols = 4
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 2.2, 2.6 * rows + 0.9), layout="constrained",
                             squeeze=False)
    st = styles(group.conditions)
    who: dict[str, list[str]] = {}
    same: dict[str, list[list[str]]] = {}
    for ax, key in zip(axes.flat, panels):
        drawn: dict[str, tuple] = {}
        for c in rl:
            curves = []
            for r in c.runs:
                series = r.diagnostics.get(key)
                if not series or r.curve is None:
                    continue
                spent = dict(zip(r.curve["step"], np.cumsum(np.asarray(r.curve["tokens"], dtype=float))))
                steps = sorted(s for s in series if s - 1 in spent)  # metrics step k follows ledger step k - 1
                if not steps:
                    continue
                x = np.array([spent[s - 1] for s in steps])
                y = moving_average(np.array([series[s] for s in steps]), max(1, len(steps) // 20))
                curves.append((x, y))
            if curves:
                drawn[c.label] = seed_band(ax, curves, st[c.label], c.label, lw=1.3, legend=False)
                who.setdefault(key, []).append(c.label)
        same[key] = coinciding(drawn)
        one_band(same[key], drawn)
        note = "; ".join(PANEL_NOTES[key, arm] for arm in sorted({c.arm for c in rl}) if (key, arm) in PANEL_NOTES)
        equal = "; ".join(" = ".join(x) for x in same[key])
        ax.set_title(key + ("" if key in SHARED_DIAGNOSTICS else "  (arm's own)") + (f"  [{equal}]" if equal else "")
                     + (f"\n({note})" if note else ""), fontsize=9 if not note else 8)
        ax.xaxis.set_major_formatter(FuncFormatter(_kilo))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    for col in range(cols):  # the lowest panel of each column
        shown = [axes[r, col] for r in range(rows) if r * cols + col < len(panels)]
        if shown:
            shown[-1].set_xlabel("sampled completion tokens", fontsize=8)
    handles = [legend_handle(st[c.label], lw=1.3) for c in rl]
    labels = [f"{c.label} (n={len(c.runs)})" for c in rl]
    note = _coincide_note(same, [k for k in panels if len(who.get(k, [])) > 1])
    if note:
        handles.append(plt.Line2D([], [], linestyle=" "))
        labels.append(note)
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle("Training diagnostics (metrics.jsonl) vs sampled tokens\nmoving average over steps//20 steps, "
                 "line = mean over seeds, band = min–max over seeds (overlapping bands mix their colours)",
                 fontsize=10)
    _save(fig, path)
    return {"file": path.name, "panels": {k: who.get(k, []) for k in panels},
            "coincide": {k: v for k, v in same.items() if v}}


# --- f. performance profile (rliable)


PROFILE_MIN_RUNS = 3


def performance_profile(group: Group, scores: dict[str, list[float]], path: Path, split: str) -> dict:
    """Per condition, the fraction of its runs whose final eval accuracy is above tau, over tau in [0, 1] (rliable's
    performance profile, harness.report.robust.performance_profile): a step down at each run's score; a curve to
    the right of another is better at every level of the score. Coinciding curves are said in the legend."""
    from harness.report.robust import performance_profile as profile

    if not scores:
        return {"file": None, "skipped": "no condition has an eval"}
    if max(len(v) for v in scores.values()) < PROFILE_MIN_RUNS:  # as a cell's interval: the seeds' dots say it all
        return {"file": None, "skipped": f"fewer than {PROFILE_MIN_RUNS} seeds in every condition: each run's "
                                         "accuracy is a dot in the eval accuracy plot"}
    st = styles(group.conditions)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    drawn: dict[str, tuple] = {}
    for c in group.conditions:
        if c.label not in scores:
            continue
        x = np.asarray(scores[c.label], dtype=float)
        taus = np.unique(np.concatenate([[0.0, 1.0], x]))  # (T,) where the profile can step
        frac = profile(x, taus)  # (T,) right-continuous: at tau = a run's score that run is no longer above
        s = st[c.label]
        ax.step(taus, frac, where="post", label=f"{c.label} (n={x.size})",
                **{k: v for k, v in _line_kw(s, 1.8, None).items() if k != "marker"})
        drawn[c.label] = Drawn((taus, frac))
    same = coinciding(drawn)
    if same:
        ax.plot([], [], " ", label=coincide_text(same))
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(f"tau: greedy accuracy on {split} (fraction of views)")
    ax.set_ylabel("fraction of runs with accuracy > tau")
    ax.set_title("Performance profile over seeds (rliable, Agarwal et al. 2021)\none step down per run, at its final "
                 "eval accuracy", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    _save(fig, path)
    return {"file": path.name, "coincide": same}
