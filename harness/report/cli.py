"""`python -m harness.report DIR [--baseline grpo] [--out DIR/report]`: collect, compare, plot, write.

Writes (atomically) the PNG plots, report.json (every number of the markdown, machine-readable)
and report.md last. Exit 0 on success; 2 when DIR holds no run dir and no sweep job record.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from harness.errors import HarnessError
from harness.report.analysis import group_statistics, profile_scores
from harness.report.budget import run_row, verdict
from harness.report.compare import (Group, build_groups, data_key, describe_key, jsonable_fields, model_key, paired,
                                    resolve_baseline)
from harness.report.runs import Run, budget_kind, discover, job_run_path, read_run, starts
from harness.report.signal import group_signal
from harness.rundir import atomic_write_bytes

SOURCE_TEXT = {"sweep": "a sweep folder: the runs its jobs/<n>.json point at",
               "output_root": "an output_root: every run under runs/, every job under sweeps/",
               "run": "a single run dir",
               "folder": "a folder of run dirs, searched recursively"}


class ReportInputError(HarnessError):
    """DIR has nothing to report on."""

    exit_code = 2


def teacher_of(r) -> dict:
    """What a distilled run (opd) learned from: its teacher's run (or directory), arm, digest and final eval."""
    t = r.identity["teacher"]
    return {k: t.get(k) for k in ("spec", "run_name", "arm", "path", "weights_sha256", "eval_accuracy", "eval_split")}


def _parent_seconds(r: Run) -> float | None:
    """Seconds the process that finished the run spent running its parent (SFT warm start, teacher) first; not in
    its time to first step."""
    v = ((r.completion or {}).get("start_phases_s") or {}).get("parent")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _parent_role(r: Run) -> str | None:
    """What the run's parent is: its SFT warm start, its teacher, or both."""
    roles = (["its SFT warm start"] if r.parent else []) + (["its teacher"] if (r.identity.get("teacher") or {})
                                                             .get("run_name") else [])
    return " and ".join(roles) or None


def _plot_note(signal: dict) -> str | None:
    """The eval plots' warning: the policy abstains on every view (the full text is in report.md)."""
    for w in signal["warnings"]:
        if w["kind"] == "abstains_everywhere":
            return (f"No signal: {w['headline'].replace('`', '')}: its accuracy is only the share of MISSING views "
                    "(where abstaining is right), 0 on the other relations. See report.md for the fix.")
    return None


def _no_runs(d: Path, why: str) -> ReportInputError:
    return ReportInputError(
        f"harness.report: DIR = '{d}': {why}; expected an output_root (with runs/ and sweeps/), a sweep folder "
        f"(<output_root>/sweeps/<time>/ with jobs/<n>.json) or a folder containing run dirs (run_manifest.json). "
        f"fix: pass the output_root of your runs (default `outputs`) or one of its sweeps/<time> folders.")


def _code_identity(runs: list[Run]) -> dict:
    variants: dict[tuple, int] = {}
    for r in runs:
        code = r.identity.get("code") or {}
        key = (code.get("commit"), bool(code.get("dirty")), code.get("diff_sha256"))
        variants[key] = variants.get(key, 0) + 1
    return {"uniform": len(variants) == 1,
            "variants": [{"commit": k[0], "dirty": k[1], "diff_sha256": k[2], "runs": n} for k, n in variants.items()]}


def _remove_stale_plots(out: Path, keep: set[str]) -> None:
    """Plots of an earlier report in the same folder (e.g. -g2 after the groups changed) would mislead."""
    for p in out.glob("*.png"):
        if re.fullmatch(r"(reward_vs_tokens|eval_accuracy_by_relation|budget_use|accuracy_vs_tokens|diagnostics|"
                        r"performance_profile)(-g\d+)?\.png", p.name) \
                and p.name not in keep:
            p.unlink()


def _place_incomplete(groups: list[Group], runs: list[Run]) -> dict[int, list[tuple[str, Run]]]:
    """Incomplete runs whose semantic config is a condition's: {id(condition): [(label, run)]}. A config found
    in several groups goes to the group of the same data and model identity, else the first."""
    placed: dict[int, list[tuple[str, Run]]] = {}
    for r in runs:
        key = json.dumps(r.semantic, sort_keys=True, default=str)
        found = [(g, c) for g in groups for c in g.conditions if c.key == key]
        if not found:
            continue
        same = [(g, c) for g, c in found if (g.data, g.model) == (data_key(r), model_key(r))]
        g, c = (same or found)[0]
        placed.setdefault(id(c), []).append((c.label, r))
    return placed


def _budget_rows(g: Group, placed: dict[int, list[tuple[str, Run]]]) -> list[dict]:
    rows = []
    for c in g.conditions:
        rows += [run_row(r, c.label) for r in c.runs]
        rows += [run_row(r, c.label, duplicate=True) for r in c.duplicates]
        rows += [run_row(r, label) for label, r in placed.get(id(c), [])]
    return rows


def _group_json(g: Group, plots: dict, budget_rows: list[dict] | None = None, split: str | None = None,
                statistics: dict | None = None) -> dict:
    budget_rows = budget_rows or []
    return {
        "index": g.index, "data": describe_key(g.data), "model": describe_key(g.model),
        "data_key": g.data, "model_key": g.model,
        "conditions": [{
            "label": c.label, "arm": c.arm, "fields": jsonable_fields(c.fields), "warm_start": c.warm_start,
            "seeds": c.seeds, "budget_kind": budget_kind(c.runs[0]),
            "runs": [{"seed": r.seed, "run": r.name, "path": str(r.path), "starts": starts(r),
                      "first_step_s": r.metrics.get("perf/first_step_s"),
                      "parent_s": _parent_seconds(r), "parent_run": _parent_role(r),
                      **({"teacher": teacher_of(r)} if r.identity.get("teacher") else {})} for r in c.runs],
            "duplicates": [{"seed": r.seed, "run": r.name, "path": str(r.path)} for r in c.duplicates],
            "metrics": {k: v for k, v in c.summary.items() if k != "stopped_by"},
            "stopped_by": c.summary["stopped_by"],
        } for c in g.conditions],
        "baseline": g.baseline.label if g.baseline else None, "baseline_note": g.baseline_note,
        "paired": g.paired, "unpaired": g.unpaired, "plots": plots, "signal": group_signal(g, split),
        **(statistics or {}),  # robust, efficiency (harness.report.analysis)
        "budget_runs": budget_rows, "budget_bound": verdict(budget_rows),
        "wall_time_note": wall_time_note([r for c in g.conditions for r in c.runs]),
    }


def wall_time_note(runs: list[Run]) -> str | None:
    """A caveat under the wall-time column: wall times compare only under the same machine load. The report cannot
    see the load, but it sees runs whose last process ran at the same time as another's (completion.json's
    completed_at minus wall_time_s): they slowed each other."""
    spans = []
    for r in runs:
        c = r.completion or {}
        try:
            end = dt.datetime.fromisoformat(str(c.get("completed_at"))).timestamp()
            spans.append((r.name, end - float(c["wall_time_s"]), end))
        except (KeyError, TypeError, ValueError):
            continue
    if len(spans) < 2:
        return None
    overlapping = sorted({a[0] for a in spans for b in spans if a is not b and a[1] < b[2] and b[1] < a[2]})
    text = ("Wall time compares runs only when they ran under the same machine load (the same machine, nothing "
            "else running); this report cannot see the load.")
    if overlapping:
        text += (f" {len(overlapping)} of these {len(spans)} runs ran at the same time as another run of this group "
                 "(their wall-clock intervals overlap), so they slowed each other: do not compare their wall times; "
                 "compare tokens and steps, or time runs one at a time (bench/).")
    return text


def _draw(g: Group, out: Path, sfx: str, split: str | None) -> dict:
    """The group's plots (`sfx`: -g<k> when the report has several groups): plot name -> what plots.* returned."""
    from harness.report import plots as P  # matplotlib only when there is something to draw

    note = _plot_note(group_signal(g, split))
    return {
        "reward_vs_tokens": P.reward_vs_tokens(g, out / f"reward_vs_tokens{sfx}.png"),
        "eval_accuracy_by_relation": P.eval_accuracy_by_relation(g, out / f"eval_accuracy_by_relation{sfx}.png",
                                                                 split or "eval", note),
        "budget_use": P.budget_use(g, out / f"budget_use{sfx}.png"),
        "accuracy_vs_tokens": P.accuracy_vs_tokens(g, out / f"accuracy_vs_tokens{sfx}.png", split or "eval", note),
        "diagnostics": P.diagnostics(g, out / f"diagnostics{sfx}.png"),
        "performance_profile": P.performance_profile(g, profile_scores(g), out / f"performance_profile{sfx}.png",
                                                     split or "eval"),
    }


def _unfinished_jobs(jobs: list, complete: list[Run], notes: list[str]) -> list:
    """The sweep jobs that did not complete, but those whose run a later command completed: a job interrupted by a
    signal (or failed) whose run dir now holds a complete run was finished by the same command run again (its
    record stays as it was written); it is named in the notes, not listed as a failure."""
    done = {r.path.resolve() for r in complete}
    out = []
    for j in jobs:
        if j.status == "completed":
            continue
        path = job_run_path(j, Path(j.sweep))  # the recorded run dir, or the same name where the sweep was moved
        if path is not None and path.resolve() in done:
            notes.append(f"{Path(j.sweep).name} job {j.job} ({' '.join(j.overrides)}) ended {j.status}; its run "
                         f"{path.name} was completed later (the same command run again)")
            continue
        out.append(j)
    return out


def build_report(directory: Path, baseline: str = "grpo", out: Path | None = None,
                 threshold: float | None = None) -> tuple[dict, Path]:
    """Read DIR, write the report into `out` (default DIR/report); returns (report.json content, report.md path).
    `threshold`: the eval accuracy whose tokens-to-reach the efficiency section reports (None: its default rule)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise _no_runs(directory, "is not a directory")
    source = discover(directory)
    if not source.run_paths and not source.jobs:
        raise _no_runs(directory, "found no run dirs and no sweep job records")
    out = Path(out) if out is not None else directory / "report"
    runs = [read_run(p) for p in source.run_paths]
    complete = [r for r in runs if r.complete]
    groups = build_groups(complete)
    multi = len(groups) > 1
    split_set = sorted({r.eval_split for r in complete if r.eval_after})
    split = split_set[0] if len(split_set) == 1 else (", ".join(split_set) or None)

    placed = _place_incomplete(groups, [r for r in runs if not r.complete])
    where = {id(r): (g.index, label) for g in groups for c in g.conditions for label, r in placed.get(id(c), [])}
    groups_json = []
    for g in groups:
        resolve_baseline(g, baseline)
        g.paired = paired(g)
        statistics = group_statistics(g, threshold)
        drawn = _draw(g, out, f"-g{g.index}" if multi else "", split)
        groups_json.append(_group_json(g, drawn, _budget_rows(g, placed), split, statistics))

    _remove_stale_plots(out, {p["file"] for g in groups_json for p in g["plots"].values() if p.get("file")})
    identity_note = None
    if multi:
        datas = sorted({g["data"] for g in groups_json})
        models = sorted({g["model"] for g in groups_json})
        what = "/".join(w for w, vals in (("data", datas), ("model", models)) if len(vals) > 1)
        detail = "; ".join(f"group {g['index']}: data {g['data']}, model {g['model']}" for g in groups_json)
        identity_note = (f"{len(groups)} groups: runs differ in {what} identity ({detail}). "
                         "Runs of different groups are never averaged or compared.")
    notes = list(source.notes)
    for r in runs:
        notes += [f"{r.name}: {n}" for n in r.notes]
    for g in groups:
        for c in g.conditions:
            for r in c.duplicates:
                kept = next(x.name for x in c.runs if x.seed == r.seed)
                notes.append(f"{c.label}: seed {r.seed} has a second run {r.name}; only {kept} is averaged")
    rep = {
        "dir": str(directory), "out": str(out), "source": source.kind,
        "source_description": SOURCE_TEXT[source.kind],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "baseline_requested": baseline,
        "counts": {"runs": len(complete), "incomplete": len(runs) - len(complete),
                   "conditions": sum(len(g.conditions) for g in groups), "groups": len(groups),
                   "seeds": sorted({r.seed for r in complete if r.seed is not None}), "jobs": len(source.jobs)},
        "code": _code_identity(complete),
        "eval_split": split,
        "identity_note": identity_note,
        "groups": groups_json,
        "incomplete_runs": [{"run": r.name, "path": str(r.path), "arm": r.arm, "seed": r.seed, "status": r.status,
                             "manifest_status": r.manifest.get("status"),
                             "group": where.get(id(r), (None, None))[0], "condition": where.get(id(r), (None, None))[1]}
                            for r in runs if not r.complete],
        "failed_jobs": [{"sweep": j.sweep, "sweep_name": Path(j.sweep).name, "job": j.job, "overrides": j.overrides,
                         "status": j.status, "exit_code": j.exit_code, "error": j.error, "run_dir": j.run_dir}
                        for j in _unfinished_jobs(source.jobs, complete, notes)],
        "notes": notes,
    }
    from harness.report.render import markdown

    atomic_write_bytes(out / "report.json", (json.dumps(rep, indent=2, allow_nan=False) + "\n").encode("utf-8"))
    md = out / "report.md"
    atomic_write_bytes(md, markdown(rep).encode("utf-8"))  # last: its presence means the rest is there
    return rep, md


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m harness.report",
        description="Compare the runs under DIR (an output_root, a sweep folder, or any folder of run dirs): "
                    "tables over seeds, a paired bootstrap against a baseline, and plots.")
    p.add_argument("dir", metavar="DIR", type=Path, help="output_root, <output_root>/sweeps/<time>, or a folder of run dirs")
    p.add_argument("--baseline", default="grpo",
                   help="condition label or arm the paired comparison is against (default: grpo)")
    p.add_argument("--out", type=Path, default=None, help="where to write the report (default: DIR/report)")
    p.add_argument("--threshold", type=float, default=None, metavar="ACC",
                   help="eval accuracy in [0, 1] whose sampled tokens to reach the efficiency section reports "
                        "(default: half-way from the init's accuracy to the best condition's final accuracy)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
            raise ReportInputError(f"--threshold {args.threshold}: an eval accuracy must lie in [0, 1]; pass e.g. "
                                   "--threshold 0.6, or leave it out for the default (half-way from the init to the "
                                   "best final accuracy).")
        rep, md = build_report(args.dir, args.baseline, args.out, args.threshold)
    except HarnessError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    from harness.report.render import summary

    print(summary(rep, str(md)))
    return 0
