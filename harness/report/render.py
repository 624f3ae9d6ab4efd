"""report.json -> report.md and the stdout summary. Every number shown comes from report.json."""

from __future__ import annotations

from harness.report.mdtable import table as _table
from harness.metrics import EVAL_METRICS, METRIC_TITLES, OFFPOLICY_METRICS, TRAIN_METRICS
from harness.report.render_stats import efficiency_section, item_cell, item_text, power_lines, robust_section
from harness.report.stats import EXACT_MAX, MC_RESAMPLES, MC_SEED

DASH = "–"


# --- number formats


def _num(key: str, v: float, signed: bool = False) -> str:
    sign = "+" if signed else ""
    if key == "budget/fraction":
        return f"{v * 100:{sign}.1f}%"
    if key in ("budget/tokens", "budget/ceiling"):
        return f"{v:{sign},.0f}"
    if key == "train/optimizer_steps":
        return f"{v:{sign}.0f}" if float(v).is_integer() else f"{v:{sign}.1f}"
    if key in ("perf/wall_time_s", "perf/first_step_s"):
        return f"{v:{sign}.1f}"
    return f"{v:{sign}.3f}"


def metric_range(key: str) -> tuple[float, float] | None:
    """The values a metric can take: accuracies and rates in [0, 1], the accuracy change in [-1, 1]."""
    if key == "eval/accuracy_change":
        return (-1.0, 1.0)
    if key.startswith("eval/") or key == "budget/fraction":
        return (0.0, 1.0)
    return None


#: footnote markers of the cells without an interval (one footnote per table, below it): seeds -> (marker, text)
FEW_SEEDS = {
    2: ("†", "two seeds: the mean only. A 95% t interval from two seeds (one degree of freedom) spans ±12.7 sd and "
             "says nothing; 3 or more seeds give one."),
    1: ("‡", "one seed: its value, no interval."),
}


def cell(key: str, s: dict, marks: set | None = None) -> str:
    """'mean ± half-width (n=k)'; where that interval leaves the metric's range, 'mean [low, high] (n=k, cut at
    the range)'; two seeds: the mean and no interval (a t interval with one degree of freedom is +-12.7 sd:
    not informative); one seed: 'value (n=1)'; none: '–'. With `marks` (a set the caller turns into footnotes
    below its table: `footnotes`), one and two seeds are the value and a marker (FEW_SEEDS), and the seed counts
    used are added to `marks`."""
    if not s or not s.get("n"):
        return DASH
    signed = key == "eval/accuracy_change"
    mean = _num(key, s["mean"], signed)
    if s["n"] in FEW_SEEDS and marks is not None:
        marks.add(s["n"])
        return mean + FEW_SEEDS[s["n"]][0]
    if s["n"] == 1:
        return f"{mean} (n=1)"
    if s["n"] == 2:
        return f"{mean} (n=2: too few seeds for an interval)"
    lo, hi, bounds = s["mean"] - s["half_width"], s["mean"] + s["half_width"], metric_range(key)
    if bounds and (lo < bounds[0] or hi > bounds[1]):
        cut = f"[{_num(key, max(lo, bounds[0]), signed)}, {_num(key, min(hi, bounds[1]), signed)}]"
        return f"{mean} {cut} (n={s['n']}, t interval cut at the range)"
    hw = _num(key, s["half_width"]) if key != "budget/fraction" else f"{s['half_width'] * 100:.1f}%"
    return f"{mean} ± {hw} (n={s['n']})"


def footnotes(marks: set) -> list[str]:
    """The footnote lines (below a table) of the markers its cells used."""
    return [""] + [f"{FEW_SEEDS[n][0]} {FEW_SEEDS[n][1]}" for n in sorted(marks, reverse=True)] if marks else []


# --- markdown


def _header(rep: dict) -> list[str]:
    c = rep["counts"]
    seeds = ", ".join(map(str, c["seeds"])) or DASH
    lines = ["# Run comparison", "",
             f"- DIR: `{rep['dir']}` ({rep['source_description']})",
             f"- created: {rep['created_at']}",
             f"- runs: {c['runs']} complete in {c['conditions']} condition(s), seeds {seeds}"
             + (f"; {c['incomplete']} incomplete (listed below, never averaged)" if c["incomplete"] else ""),
             f"- eval: greedy decoding on split `{rep['eval_split']}`" if rep["eval_split"] else "- eval: none found"]
    code = rep["code"]
    if code["uniform"] and code["variants"]:
        v = code["variants"][0]
        lines.append(f"- harness code: commit `{str(v['commit'])[:12]}`" + (" (dirty)" if v["dirty"] else " (clean)"))
    elif code["variants"]:
        parts = [f"`{str(v['commit'])[:12]}`" + (f" dirty (diff {str(v['diff_sha256'])[:8]})" if v["dirty"] else " clean")
                 + f" ({v['runs']} run{'s' if v['runs'] != 1 else ''})" for v in code["variants"]]
        lines.append("- harness code differs across runs: " + ", ".join(parts))
    lines.append(f"- baseline for paired comparisons: `{rep['baseline_requested']}`")
    if rep["identity_note"]:
        lines += ["", f"**{rep['identity_note']}**"]
    return lines


def _group(rep: dict, g: dict) -> list[str]:
    multi = len(rep["groups"]) > 1
    h = "###" if multi else "##"
    out: list[str] = []
    if multi:
        out += ["", f"## Group {g['index']}: data {g['data']}; model {g['model']}"]
    conds = g["conditions"]
    split = rep["eval_split"] or "eval"
    has_dir = any(c["metrics"]["eval/direction_accuracy"]["n"] for c in conds)
    eval_keys = [k for k, _ in EVAL_METRICS if k != "eval/direction_accuracy" or has_dir]
    out += _signal(g)
    out += ["", f"{h} Eval accuracy (greedy, split `{split}`)", "",
            "Each cell: mean ± half-width of the 95% Student-t interval over seeds (n seeds); where it would leave "
            "the metric's range ([0, 1] for accuracies) it is shown as [low, high] cut at the range; one or two "
            "seeds: the mean only, marked (footnote below the table). "
            "`change` = accuracy − accuracy before training (the init policy), per seed. Relation columns: "
            "accuracy on that relation's views; FULL abstention: fraction of FULL views answered with the "
            "abstention.", ""]
    marks: set = set()
    out += _table(["condition"] + [METRIC_TITLES[k] for k in eval_keys],
                  [[c["label"]] + [cell(k, c["metrics"][k], marks) for k in eval_keys] for c in conds])
    out += footnotes(marks)
    out += ["", f"{h} Training and budget", "",
            "Train reward: mean reward of the completions of the last 10% of steps (trace rows; RL only). "
            "Tokens: sampled completion tokens (ledger) for RL runs, loss tokens for SFT runs (budget kind column). "
            "Time to first step: seconds from the start of the run's own stages (imports, data, model, eval before) "
            "to its first optimizer step, in the process that finished the run; an SFT warm start (or teacher) "
            "that process ran first is not counted (its seconds are listed per run under Conditions); the first run "
            "of a process also pays the imports.", ""]
    rows = []
    marks = set()
    for c in conds:
        stopped = ", ".join(f"{k} ×{v}" for k, v in c["stopped_by"].items()) or DASH
        rows.append([c["label"], c["budget_kind"]] + [cell(k, c["metrics"][k], marks) for k, _ in TRAIN_METRICS[:5]]
                    + [stopped] + [cell(k, c["metrics"][k], marks) for k in ("perf/wall_time_s", "perf/first_step_s")])
    out += _table(["condition", "budget kind"] + [t for _, t in TRAIN_METRICS[:5]]
                  + ["stopped by", METRIC_TITLES["perf/wall_time_s"], METRIC_TITLES["perf/first_step_s"]], rows)
    out += footnotes(marks)
    if g.get("wall_time_note"):
        out += ["", g["wall_time_note"]]
    out += _budget_section(g, h)
    out += _offpolicy_section(g, h)
    out += _paired_section(g, h)
    for u in g.get("unpaired") or []:
        out += ["", f"Not paired: `{u['condition']}`: {u['why']} ({u['fix']})."]
    out += robust_section(g, h) + efficiency_section(g, h)
    out += _conditions_and_plots(g, h)
    return out


def _offpolicy_section(g: dict, h: str) -> list[str]:
    """rollout=async conditions: how old their rounds were and how far the correction's weights moved."""
    conds = [c for c in g["conditions"] if c["metrics"]["offpolicy/mean_age"]["n"]]
    if not conds:
        return []
    marks: set = set()
    out = ["", f"{h} Off-policy rounds", "",
           "Conditions whose rounds were sampled ahead of the trainer (rollout=async). Age: rounds between the "
           "weights that sampled a completion and the weights that trained it, mean over the trained completions. "
           "Drift: mean over completions of abs(w - 1), w the completion's importance weight (TRL's, mean over its "
           "tokens at token level). Masked: share of completions whose weight the caps set to 0. What the lag costs "
           "in accuracy per sampled token: the eval table above and the efficiency section.", ""]
    out += _table(["condition"] + [t for _, t in OFFPOLICY_METRICS],
                  [[c["label"]] + [cell(k, c["metrics"][k], marks) for k, _ in OFFPOLICY_METRICS] for c in conds])
    return out + footnotes(marks)


def _paired_section(g: dict, h: str) -> list[str]:
    """The paired comparison of every condition against the group's baseline (its rows from report.json)."""
    out: list[str] = []
    out += ["", f"{h} Paired comparison vs baseline", ""]
    if g["baseline"] is None:
        out.append(g["baseline_note"])
    else:
        out += [f"Baseline: `{g['baseline']}`. For each seed s both conditions have, d_s = metric(condition, s) − "
                f"metric(baseline, s); shown: mean of d_s, its 95% percentile bootstrap interval over seeds "
                f"(exact enumeration of all resamples for n ≤ {EXACT_MAX} paired seeds, else {MC_RESAMPLES:,} "
                f"resamples with numpy default_rng({MC_SEED}); quantile rule: inverted CDF, the smallest resampled "
                "mean whose cumulative probability reaches 2.5% / 97.5%), and the number of paired seeds. "
                "With 2 or 3 paired seeds this interval is just the range [min d_s, max d_s] (each extreme "
                "resample has probability ≥ 1/27 > 2.5%): read it as the spread of the seeds, not as evidence. "
                + item_text(), ""]
        rows = []
        for p in g["paired"]:
            if p["n"] == 0:
                rows.append([p["condition"], METRIC_TITLES[p["metric"]], DASH, "no common seeds", DASH, "0"])
                continue
            ci = (f"[{_num(p['metric'], p['low'], True)}, {_num(p['metric'], p['high'], True)}]"
                  if p["low"] is not None else "no interval (1 paired seed)")
            rows.append([p["condition"], METRIC_TITLES[p["metric"]], _num(p["metric"], p["mean"], True), ci,
                         item_cell(p), f"{p['n']} (seed{'s' if p['n'] > 1 else ''} {', '.join(map(str, p['seeds']))})"])
        same = [c for s in (g.get("signal") or {}).get("indistinguishable") or [] if g["baseline"] in s["conditions"]
                for c in s["conditions"] if c != g["baseline"]]
        if same:
            out += [f"{', '.join(f'`{c}`' for c in same)}: the same numbers as the baseline on every seed (No signal "
                    "above): every difference is exactly 0.", ""]
        if rows:
            out += _table(["condition", "metric", "mean difference", "95% bootstrap interval (seeds)",
                           "95% interval per item (seeds, then views)", "paired seeds"], rows)
            out += power_lines(g)
        else:
            out.append("No condition to pair against the baseline.")
    return out


def _conditions_and_plots(g: dict, h: str) -> list[str]:
    """Each condition's runs (seeds, starts, teacher, parent) and the group's plots."""
    conds = g["conditions"]
    out: list[str] = []
    out += ["", f"{h} Conditions", ""]
    for c in conds:
        fields = ", ".join(f"{k}={v}" for k, v in c["fields"].items())
        out.append(f"- **{c['label']}**: arm `{c['arm']}`" + (f"; differs in {fields}" if fields else "")
                   + ("; SFT warm start of RL runs in this report" if c["warm_start"] else ""))
        for r in c["runs"]:
            out.append(f"  - seed {r['seed']}: `{r['run']}`{_starts(r.get('starts') or [])}{_teacher(r.get('teacher'))}"
                       + _parent_note(r.get("parent_s"), r.get("parent_run")))
        for r in c["duplicates"]:
            out.append(f"  - seed {r['seed']} again: `{r['run']}` (a second run of this seed: listed, not averaged)")
    out += ["", f"{h} Plots", ""]
    for key, caption in (("accuracy_vs_tokens", "Held-out accuracy vs sampled tokens"),
                         ("reward_vs_tokens", "Train reward vs cumulative sampled completion tokens"),
                         ("eval_accuracy_by_relation", "Eval accuracy by relation"),
                         ("diagnostics", "Training diagnostics (metrics.jsonl)"),
                         ("performance_profile", "Performance profile: fraction of runs above each accuracy"),
                         ("budget_use", "Budget use (RL conditions)")):
        p = g["plots"].get(key) or {}
        if p.get("file"):
            out += [f"![{caption}]({p['file']})", ""]
        else:
            out += [f"- {caption}: not drawn ({p.get('skipped', 'nothing to plot')})", ""]
    if any(c["budget_kind"] == "loss" for c in conds):
        out.append("SFT conditions are not in the budget plot: they train on a loss-token budget and sample no "
                   "completion tokens (their loss tokens are in the table above).")
    return out


def _teacher(t: dict | None) -> str:
    """'; teacher `grpo-...` (grpo, accuracy 0.968 on test)' for a distilled run (opd)."""
    if not t:
        return ""
    acc = f", accuracy {t['eval_accuracy']:.3f} on {t['eval_split']}" if t.get("eval_accuracy") is not None else ""
    return f"; teacher `{t.get('run_name') or t.get('path')}` ({t.get('arm') or 'a policy directory'}{acc})"


def _starts(starts: list[dict]) -> str:
    """'; 2 starts, first step at 14.9 s, 3.1 s' (each start's seconds from the run's own start to its first
    optimizer step: a parent run first in the same process is not counted, as in the training table)."""
    from harness.report.runs import own_first_step

    firsts = [own_first_step(s.get("seconds") or {}) for s in starts]
    shown = ", ".join(f"{v:.1f} s" if isinstance(v, (int, float)) else "none" for v in firsts)
    return f"; {len(starts)} start{'s' if len(starts) != 1 else ''}, first step at {shown}" if starts else ""


def _parent_note(parent_s: float | None, role: str | None = None) -> str:
    """'; its process ran its SFT warm start first (73.5 s, not counted)': the seconds `_starts` leaves out."""
    if not parent_s:
        return ""
    return f"; its process ran {role or 'its parent run'} first ({parent_s:.1f} s, not counted)"


def _signal(g: dict) -> list[str]:
    """The group's no-signal warnings (report.json group `signal`), first thing under its heading."""
    out = []
    for w in (g.get("signal") or {}).get("warnings") or []:
        fix = f" {w['fix']}" if w.get("fix") else ""
        out += ["", f"> **No signal: {w['headline']}.** {w['text']}{fix}"]
    return out


def _stopped_cell(r: dict) -> str:
    if not r["complete"]:
        return DASH
    if r["stopped_by"] is None:
        return "not recorded"
    if r["budget_kind"] == "loss" and r.get("sft_rows") is not None:
        return f"{r['stopped_by']} ({r['sft_rows']:,} rows)"
    return str(r["stopped_by"])


def _budget_section(g: dict, h: str) -> list[str]:
    rows = g.get("budget_runs") or []
    if not rows:
        return []
    v = g["budget_bound"]
    out = ["", f"{h} Budget per run", "", f"**{v['verdict']}**", "",
           "A comparison is budget-bound when every RL run stopped because of budget.max_completion_tokens "
           "(completion.json `stopped_by` = budget; max_steps only a safety cap) and their realized sampled tokens "
           "lie within one generation round's bound of each other (plan: per_step_upper_bound × "
           "arm.steps_per_generation, all ranks; the largest over the runs; runs of different ceilings are "
           "compared within their ceiling). Tokens: sampled completion tokens (RL), loss tokens (SFT).", ""]
    table = []
    for r in rows:
        status = r["status"] + (" (second run of this seed: not averaged)" if r["duplicate"] else "")
        table.append([f"`{r['run']}`", r["condition"] or DASH, str(r["seed"]), status,
                      _num("train/optimizer_steps", r["optimizer_steps"]) if r["optimizer_steps"] is not None else DASH,
                      str(r["max_steps"]) if r["max_steps"] is not None else DASH, r["budget_kind"],
                      _num("budget/tokens", r["tokens"]) if r["tokens"] is not None else DASH,
                      _num("budget/ceiling", r["ceiling"]) if r["ceiling"] is not None else DASH,
                      _num("budget/fraction", r["fraction"]) if r["fraction"] is not None else DASH,
                      _stopped_cell(r)])
    out += _table(["run", "condition", "seed", "status", "optimizer steps", "max steps", "token kind", "tokens",
                   "ceiling", "% of ceiling", "stopped by"], table)
    if any(r["budget_kind"] == "loss" for r in rows):
        out += ["", "SFT runs train on the longest prefix of one epoch whose loss tokens fit the cap, cut at "
                "max_steps: `stopped by` is max_steps when they ran budget.max_steps steps, else the loss-token "
                "cap or the end of the epoch (completion.json does not tell those two apart; its own `stopped_by` "
                "is the trainer's, kept in report.json as `stopped_by_recorded`)."]
    return out


def markdown(rep: dict) -> str:
    out = _header(rep)
    for g in rep["groups"]:
        out += _group(rep, g)
    out += ["", "## Incomplete runs", ""]
    if rep["incomplete_runs"]:
        out += ["Not averaged into any table or plot.", ""]
        out += _table(["run", "arm", "seed", "status", "path"],
                      [[r["run"], r["arm"], str(r["seed"]), r["status"], f"`{r['path']}`"] for r in rep["incomplete_runs"]])
    else:
        out.append("None.")
    out += ["", "## Failed jobs", ""]
    failed = rep["failed_jobs"]
    if failed:
        out += _table(["sweep", "job", "overrides", "exit code", "error", "run dir"],
                      [[j["sweep_name"], str(j["job"]), " ".join(j["overrides"]), str(j["exit_code"]),
                        j["error"] or DASH, f"`{j['run_dir']}`" if j["run_dir"] else DASH] for j in failed])
    else:
        n = rep["counts"]["jobs"]
        out.append(f"None ({n} sweep job record{'s' if n != 1 else ''} read)." if n else
                   "No sweep job records (jobs/<n>.json) under DIR.")
    if rep["notes"]:
        out += ["", "## Notes", ""] + [f"- {n}" for n in rep["notes"]]
    return "\n".join(out) + "\n"


# --- stdout


def summary(rep: dict, md_path: str) -> str:
    lines = [f"report: {md_path}"]
    if rep["identity_note"]:
        lines.append(rep["identity_note"])
    header = ["condition", "n", "accuracy", "change", "FULL", "budget used"]
    for g in rep["groups"]:
        if len(rep["groups"]) > 1:
            lines.append(f"group {g['index']}: data {g['data']}; model {g['model']}")
        rows = [header]
        for c in g["conditions"]:
            m = c["metrics"]
            rows.append([c["label"], str(len(c["runs"])), cell("eval/accuracy", m["eval/accuracy"]).split(" (n=")[0],
                         cell("eval/accuracy_change", m["eval/accuracy_change"]).split(" (n=")[0],
                         cell("eval/FULL/accuracy", m["eval/FULL/accuracy"]).split(" (n=")[0],
                         cell("budget/fraction", m["budget/fraction"]).split(" (n=")[0]
                         + (" (loss tok)" if c["budget_kind"] == "loss" else "")])
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        if (g.get("budget_bound") or {}).get("rl_runs"):
            lines.append(g["budget_bound"]["verdict"])
        for w in (g.get("signal") or {}).get("warnings") or []:
            lines.append(f"NO SIGNAL: {w['headline']}. {w['text']}")
            if w.get("fix"):
                lines.append(f"  {w['fix']}")
    few = any(c["metrics"]["eval/accuracy"].get("n") in (1, 2) for g in rep["groups"] for c in g["conditions"])
    lines.append("cells: mean ± half-width of the 95% t interval over seeds"
                 + (" (1 or 2 seeds: the mean only)" if few else "") + "; paired comparisons and plots in report.md")
    if rep["counts"]["incomplete"]:
        lines.append(f"{rep['counts']['incomplete']} incomplete run(s) listed, not averaged")
    if rep["failed_jobs"]:
        lines.append(f"{len(rep['failed_jobs'])} failed job(s): "
                     + ", ".join(f"{j['sweep_name']}#{j['job']}" for j in rep["failed_jobs"]))
    return "\n".join(lines)
