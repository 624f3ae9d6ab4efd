"""What stopped each run, and whether a group's RL comparison is bound by the token budget. Torch-free.

A comparison of RL arms is budget-bound when every RL run stopped because of
budget.max_completion_tokens (completion.json `stopped_by` == "budget"; max_steps only a safety cap
above) and the realized sampled tokens of the runs lie within one generation round's bound of each
other. One round's bound is the worst case tokens of one generation round over all ranks:
plan.budget.per_step_upper_bound x plan.config.arm.steps_per_generation (the largest over the runs
compared). Runs of different token ceilings (a budget sweep) are compared within their ceiling only.

SFT runs have no sampled tokens: their limit is derived from what completion.json records (the
epoch prefix's loss tokens against their cap, optimizer steps against budget.max_steps). Their own
`stopped_by` is the trainer's, whose max_steps the harness set to the prefix's steps, so it says
"max_steps" whatever cut the prefix; report.json keeps it as `stopped_by_recorded`.
"""

from __future__ import annotations

from harness.report.runs import Run, budget_kind

SFT_STEP_CAP = "max_steps"
SFT_PREFIX = "loss-token cap or end of epoch"


def _num(v) -> float | int | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _plan(run: Run) -> dict:
    return run.manifest.get("plan") or {}


def max_steps_of(run: Run) -> int | None:
    plan = _plan(run)
    return _num((plan.get("budget") or {}).get("max_steps")) or _num(((plan.get("config") or {}).get("budget")
                                                                       or {}).get("max_steps"))


def round_bound_of(run: Run) -> int | None:
    """Worst-case sampled tokens of one generation round (all ranks), from the run's plan; None if not recorded."""
    plan = _plan(run)
    budget = plan.get("budget") or {}
    planned = _num((budget.get("generation_round") or {}).get("token_bound"))  # harness.rounds, as planned
    if planned is not None:
        return int(planned)
    per_step = _num(budget.get("per_step_upper_bound"))  # plans written before harness.rounds
    spg = _num(((plan.get("config") or {}).get("arm") or {}).get("steps_per_generation"))
    return int(per_step * spg) if per_step is not None and spg is not None else None


def _is_rl(run: Run) -> bool:
    if run.completion:
        return budget_kind(run) == "sampled"
    plan = _plan(run)
    if plan.get("kind"):
        return plan["kind"] == "rl"
    # plans written before Plan.kind: the budget's kind, or (older still) any arm but sft
    return (plan.get("budget") or {}).get("kind") == "completion_tokens" or run.arm != "sft"


def run_row(run: Run, condition: str | None, *, duplicate: bool = False) -> dict:
    """One row of the per-run budget table (report.json `budget_runs`)."""
    c = run.completion or {}
    rl = _is_rl(run)
    row = {"run": run.name, "path": str(run.path), "condition": condition, "arm": run.arm, "seed": run.seed,
           "complete": run.complete, "status": run.status, "duplicate": duplicate,
           "budget_kind": "sampled" if rl else "loss", "optimizer_steps": _num(c.get("optimizer_steps")),
           "max_steps": max_steps_of(run), "tokens": None, "ceiling": None, "fraction": None,
           "stopped_by": None, "stopped_by_recorded": c.get("stopped_by"), "round_bound": None}
    if rl:
        row["round_bound"] = round_bound_of(run)
        row["max_steps_worst_case_tokens"] = _num((_plan(run).get("budget") or {}).get("max_steps_worst_case_tokens"))
        row["tokens"] = _num(c.get("realized_completion_tokens"))
        row["ceiling"] = _num(c.get("completion_token_ceiling")) or _num((_plan(run).get("budget") or {})
                                                                         .get("completion_token_ceiling"))
        if run.complete:
            row["stopped_by"] = c.get("stopped_by")
    else:
        row["tokens"] = _num(c.get("realized_loss_tokens"))
        row["ceiling"] = _num(c.get("loss_token_ceiling")) or _num((_plan(run).get("budget") or {})
                                                                   .get("loss_token_ceiling"))
        row["sft_rows"] = _num(c.get("sft_rows"))
        steps, cap = row["optimizer_steps"], row["max_steps"]
        if run.complete and c.get("stopped_by_source") == "sft_prefix":  # recorded by the SFT arm itself
            row["stopped_by"] = {"budget": "loss-token cap", "epoch_end": "end of epoch"}.get(c["stopped_by"],
                                                                                            c["stopped_by"])
        elif run.complete and steps is not None and cap is not None:  # runs written before it was recorded
            row["stopped_by"] = SFT_STEP_CAP if steps >= cap else SFT_PREFIX
    if row["tokens"] is not None and row["ceiling"]:
        row["fraction"] = row["tokens"] / row["ceiling"]
    return row


def _tok(v: float) -> str:
    return f"{v:,.0f}"


def _span(lo: float, hi: float) -> str:
    return _tok(lo) if lo == hi else f"{_tok(lo)}–{_tok(hi)}"


def _subset(rows: list[dict]) -> dict:
    """Spread of realized tokens against the largest round bound, for runs of one ceiling."""
    tokens = [r["tokens"] for r in rows if r["tokens"] is not None]
    bounds = [r["round_bound"] for r in rows if r["round_bound"] is not None]
    lo, hi = (min(tokens), max(tokens)) if tokens else (None, None)
    spread = hi - lo if tokens else None
    bound = max(bounds) if bounds else None
    within = None
    if spread is not None and bound is not None and len(bounds) == len(rows) and len(tokens) == len(rows):
        within = spread <= bound
    return {"ceiling": rows[0]["ceiling"], "runs": len(rows), "tokens_min": lo, "tokens_max": hi, "spread": spread,
            "round_bound": bound, "round_bounds": sorted(set(bounds)), "within_round": within}


def verdict(rows: list[dict]) -> dict:
    """The budget-bound verdict over a group's RL runs (report.json group `budget_bound`)."""
    done = [r for r in rows if r["budget_kind"] == "sampled" and r["complete"] and not r["duplicate"]]
    incomplete = sum(1 for r in rows if r["budget_kind"] == "sampled" and not r["complete"])
    stopped: dict[str, int] = {}
    for r in done:
        stopped[str(r["stopped_by"])] = stopped.get(str(r["stopped_by"]), 0) + 1
    out = {"rl_runs": len(done), "incomplete_rl_runs": incomplete, "stopped_by": stopped, "budget_bound": None,
           "tokens_min": None, "tokens_max": None, "spread": None, "round_bound": None, "ceilings": [],
           "by_ceiling": []}
    if not done:
        out["verdict"] = "budget-bound: – (no complete RL runs in this group)"
        return out
    ceilings = sorted({r["ceiling"] for r in done}, key=lambda v: (v is None, v or 0))
    subsets = [_subset([r for r in done if r["ceiling"] == c]) for c in ceilings]
    out["by_ceiling"] = subsets
    out["ceilings"] = ceilings
    known = [s for s in subsets if s["spread"] is not None]
    if known:
        out["tokens_min"] = min(s["tokens_min"] for s in known)
        out["tokens_max"] = max(s["tokens_max"] for s in known)
        out["spread"] = max(s["spread"] for s in known)
    bounds = [s["round_bound"] for s in subsets if s["round_bound"] is not None]
    out["round_bound"] = max(bounds) if bounds else None

    n = len(done)
    by_budget = stopped.get("budget", 0)
    at_steps = stopped.get("max_steps", 0)
    other = n - by_budget - at_steps

    def spread_text(s: dict) -> str:
        if s["spread"] is None:
            return "realized tokens not recorded"
        text = f"realized tokens {_span(s['tokens_min'], s['tokens_max'])} (spread {_tok(s['spread'])}"
        if s["round_bound"] is None:
            return text + "; one round's bound not recorded in the plan)"
        if s["within_round"] is None:
            return text + f"; one round's bound {_tok(s['round_bound'])}, not recorded for every run)"
        return text + f" {'≤' if s['within_round'] else '>'} one round's bound {_tok(s['round_bound'])})"

    if len(subsets) == 1:
        spreads = spread_text(subsets[0])
    else:
        spreads = "; ".join(f"ceiling {_tok(s['ceiling']) if s['ceiling'] is not None else '?'}: {spread_text(s)}"
                            for s in subsets)
    within = [s["within_round"] for s in subsets]
    if at_steps:
        out["budget_bound"] = False
        if n == 1:
            why = "the one RL run stopped at max_steps (steps, not the budget, ended it)"
        elif at_steps < n:
            why = f"{at_steps} of {n} RL runs stopped at max_steps (same steps, not same budget)"
        else:
            why = f"every RL run ({n}) stopped at max_steps (same steps, not same budget)"
        if other:
            why += f"; {other} with stopped_by not recorded"
        head = f"budget-bound: NO — {why}"
    elif other:
        head = (f"budget-bound: unknown — {other} of {n} RL run{'s' if n > 1 else ''} "
                f"{'has' if other == 1 else 'have'} no recorded stopped_by"
                f" ({', '.join(f'{k} ×{v}' for k, v in stopped.items() if k not in ('budget', 'max_steps'))})")
    elif any(w is False for w in within):
        out["budget_bound"] = False
        head = ("budget-bound: NO — every RL run stopped by its token budget, but their realized tokens lie "
                "more than one generation round apart")
    elif any(w is None for w in within):
        head = ("budget-bound: unknown — every RL run stopped by its token budget, but the token spread cannot be "
                "checked")
    else:
        out["budget_bound"] = True
        head = "budget-bound: yes — every RL run stopped by its token budget"
    line = f"{head}; {spreads}"
    if incomplete:
        line += f"; {incomplete} incomplete RL run{'s' if incomplete > 1 else ''} not counted"
    out["verdict"] = line
    return out
