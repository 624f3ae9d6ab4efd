"""Does a comparison carry signal? Torch-free and import-light (harness.report.cli).

- `abstains_everywhere(block)` (harness.eval.abstention, which the console summary printed at the end of every run
  reads too): an eval block whose policy answered every view with the abstention; the report flags the
  conditions of a group where that happened, with the fix.
- `indistinguishable(conditions)`: sets of a group's conditions whose eval accuracy, realized tokens and train
  reward are equal seed by seed on every seed they share: the data cannot tell them apart.
"""

from __future__ import annotations

import math

from harness.eval.abstention import abstains_everywhere, abstention_fix, abstention_text

#: (run metric, what it is called in a sentence): what two conditions must share on every common seed
SAME_METRICS = (("eval/accuracy", "eval accuracy"), ("budget/tokens", "realized tokens"),
                ("train/reward_last10pct", "train reward (last 10% of steps)"))


# --- conditions that cannot be told apart


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _rl(cond) -> bool:
    """An RL condition (sampled-token budget: completion.json's realized_completion_tokens, or ledgers)."""
    return cond.rl or any("realized_completion_tokens" in (r.completion or {}) for r in cond.runs)


def _pair_same(a, b) -> tuple[list, list[str]] | None:
    """(common seeds, metrics compared) when conditions a and b agree on every SAME_METRICS value of every common
    seed; None when they differ, share no seed, or lack the eval accuracy or the realized tokens."""
    if _rl(a) != _rl(b):  # sampled tokens against loss tokens: not the same quantity
        return None
    seeds = [s for s in a.seeds if s is not None and s in b.seeds]
    if not seeds:
        return None
    compared = []
    for key, _ in SAME_METRICS:
        va, vb = [a.value(key, s) for s in seeds], [b.value(key, s) for s in seeds]
        if all(x is None and y is None for x, y in zip(va, vb)):
            continue  # neither side has it (the train reward of SFT)
        if not all(_same(x, y) for x, y in zip(va, vb)):
            return None
        compared.append(key)
    return (seeds, compared) if {"eval/accuracy", "budget/tokens"} <= set(compared) else None


def indistinguishable(conditions: list) -> list[dict]:
    """Sets of conditions (in the group's order) equal on every SAME_METRICS value, seed by seed: [{"conditions":
    [labels], "seeds": [the seeds all of them share], "metrics": [keys compared], "values": {key: [per seed]}}]."""
    parent = list(range(len(conditions)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(conditions)):
        for j in range(i + 1, len(conditions)):
            if _pair_same(conditions[i], conditions[j]) is not None:
                parent[root(j)] = root(i)
    sets: dict[int, list[int]] = {}
    for i in range(len(conditions)):
        sets.setdefault(root(i), []).append(i)
    out = []
    for members in sets.values():
        if len(members) < 2:
            continue
        conds = [conditions[i] for i in members]
        seeds = [s for s in conds[0].seeds if s is not None and all(s in c.seeds for c in conds)]
        metrics = [k for k, _ in SAME_METRICS if any(conds[0].value(k, s) is not None for s in seeds)]
        out.append({"conditions": [c.label for c in conds], "seeds": seeds, "metrics": metrics,
                    "values": {k: [conds[0].value(k, s) for s in seeds] for k in metrics}})
    return out


def _fmt(key: str, v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if key == "budget/tokens" else f"{v:.3f}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def indistinguishable_text(found: dict, causes: list[str] | None = None) -> str:
    """One line for one set of `indistinguishable`: on which seeds, which metrics and their values, and what the
    runs measured about their learning signal (`causes`: `measured_causes`)."""
    names = dict(SAME_METRICS)
    what = [f"{names[k]} {' / '.join(_fmt(k, v) for v in found['values'][k])}" for k in found["metrics"]]
    seeds = found["seeds"]
    text = (f"Seed by seed (seed{'s' if len(seeds) != 1 else ''} {' / '.join(map(str, seeds))}) they have the same "
            f"{_and(what)}. The comparison between them carries no signal: their runs produced the same numbers, so "
            "every paired difference is exactly 0 and says nothing about the arms.")
    if causes:
        return f"{text} Measured: {'; '.join(causes)}."
    return (f"{text} No run of theirs lost its learning signal (their completion.json learning_signal: groups with "
            "different rewards), so the cause is not a flat reward.")


def _cause(found: dict) -> str:
    """'no update from the reward from step 1 to the end (not one well-formed answer: unbalanced_tags 100%)'."""
    until = "to the end" if found.get("recovered_at") is None else f"until step {found['recovered_at']}"
    if found.get("cause") == "no_well_formed":
        errs = ", ".join(f"{k} {100 * v / max(1, found.get('completions') or 1):.0f}%"
                         for k, v in (found.get("parser_errors") or {}).items())
        why = f"not one well-formed answer{': ' + errs if errs else ''}"
    else:
        why = (f"every group's rewards equal; {100 * (found.get('well_formed') or 0):.0f}% well-formed, "
               f"{100 * (found.get('correct') or 0):.0f}% correct")
    return f"no update from the reward from step {found.get('since_step')} {until} ({why})"


def measured_causes(conditions: list) -> list[str]:
    """For each condition with runs whose completion.json says the reward gave no update (harness.run.learning), what
    they measured: "`grpo` (seeds 0, 1): no update from the reward from step 1 to the end (...)"."""
    out = []
    for c in conditions:
        found = [(r.seed, ((r.completion or {}).get("learning_signal") or {}).get("no_update")) for r in c.runs]
        found = [(seed, f) for seed, f in found if f]
        if not found:
            continue
        texts = {}
        for seed, f in found:
            texts.setdefault(_cause(f), []).append(seed)
        out.extend(f"`{c.label}` (seed{'s' if len(seeds) != 1 else ''} {', '.join(map(str, seeds))}): {t}"
                   for t, seeds in texts.items())
    return out


# --- a group of the report


def _size(runs: list) -> str | None:
    """'debug=tiny' when every run was composed with that debug option (plan.choices), else None."""
    found = {((r.manifest.get("plan") or {}).get("choices") or {}).get("debug") for r in runs}
    return f"debug={found.pop()}" if len(found) == 1 and None not in found else None


def group_signal(group, split: str | None) -> dict:
    """report.json group `signal`: the conditions whose runs abstain on every eval view, the sets of conditions that
    cannot be told apart, and the warnings (text + fix) the markdown, the stdout summary and the run's console
    summary print. `no_signal`: any of them."""
    abstaining = []
    for c in group.conditions:
        runs = [r for r in c.runs if abstains_everywhere(r.eval_after)]
        if not runs:
            continue
        befores = [r.eval_before for r in runs if isinstance(r.eval_before, dict)]
        config = (runs[0].manifest.get("plan") or {}).get("config") or runs[0].semantic
        abstaining.append({
            "condition": c.label, "rl": _rl(c), "runs": [r.name for r in runs], "seeds": [r.seed for r in runs],
            "of": len(c.runs), "every_seed": len(runs) == len(c.runs),
            "init_abstains": all(abstains_everywhere(b) for b in befores) if befores else None,
            "text": abstention_text(runs[0].eval_after, split),
            "fix": abstention_fix(config, _rl(c), c.warm_start)})
    size = _size([r for c in group.conditions for r in c.runs])
    warnings = []
    if abstaining:
        rl = [a for a in abstaining if a["rl"]]
        full = [f"`{a['condition']}`" for a in abstaining if a["every_seed"]]
        who = ([f"every run of {_and(full)}"] if full else []) + [
            f"seed{'s' if len(a['seeds']) > 1 else ''} {', '.join(map(str, a['seeds']))} of `{a['condition']}`"
            for a in abstaining if not a["every_seed"]]
        init = ""
        if rl and all(a["init_abstains"] for a in rl):
            init = (" The RL runs' init (their eval before training) abstained on every view too: training never "
                    "started from a policy that answers.")
        warnings.append({"kind": "abstains_everywhere", "conditions": [a["condition"] for a in abstaining],
                         "headline": f"the policy abstains on every eval view in {_and(who)}",
                         "text": abstaining[0]["text"][0].upper() + abstaining[0]["text"][1:] + init,
                         "fix": (rl or abstaining)[0]["fix"]})
    same = indistinguishable(group.conditions)
    for s in same:
        warnings.append({"kind": "indistinguishable", "conditions": s["conditions"],
                         "headline": f"{_and([f'`{c}`' for c in s['conditions']])} cannot be told apart",
                         "text": indistinguishable_text(s, measured_causes(
                             [c for c in group.conditions if c.label in s["conditions"]])), "fix": None})
    return {"abstains_everywhere": abstaining, "indistinguishable": same, "size": size, "warnings": warnings,
            "no_signal": bool(warnings)}
