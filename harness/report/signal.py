"""Does a run, or a comparison, carry signal? Torch-free and import-light: the report (harness.report.cli) and the
console summary printed at the end of every run (harness.lifecycle._summary) both use it.

- `abstains_everywhere(block)`: an eval block (eval/<split>.json, completion.json's eval_after / eval_before) whose
  policy answered every view with the abstention: its `abstention_rate` is 1.0 (the share of views whose answer
  parsed to the abstention literal; with no overall rate, every relation's `per_relation` rate is 1.0). Its
  accuracy is then the share of MISSING views (where abstaining is the right answer: 0.250 on the synthetic data)
  and every other relation scores 0: the eval measures nothing training did. The rule reads the abstention rate
  itself, not "accuracy == the MISSING share", which a policy that answers can also reach by chance.
- `indistinguishable(conditions)`: sets of a group's conditions whose eval accuracy, realized tokens and train
  reward are equal seed by seed on every seed they share: the data cannot tell them apart.
"""

from __future__ import annotations

import math

RELATIONS_ORDER = ("FULL", "CONTROL", "MISSING", "SUBSTITUTE")
ABSTAINING_RELATION = "MISSING"  # the relation whose right answer is the abstention

#: (run metric, what it is called in a sentence): what two conditions must share on every common seed
SAME_METRICS = (("eval/accuracy", "eval accuracy"), ("budget/tokens", "realized tokens"),
                ("train/reward_last10pct", "train reward (last 10% of steps)"))


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def abstains_everywhere(block: dict | None) -> bool:
    """True when the eval block says every view was answered with the abstention (see the module docstring)."""
    if not isinstance(block, dict):
        return False
    rate = _num(block.get("abstention_rate"))
    if rate is not None:
        return (block.get("n") is None or (_num(block.get("n")) or 0) > 0) and rate >= 1.0 - 1e-9
    rels = [b for b in (block.get("per_relation") or {}).values() if isinstance(b, dict) and b.get("n")]
    return bool(rels) and all((_num(b.get("abstention_rate")) or 0.0) >= 1.0 - 1e-9 for b in rels)


def _rel_order(rel: str) -> tuple:
    return (RELATIONS_ORDER.index(rel), "") if rel in RELATIONS_ORDER else (len(RELATIONS_ORDER), rel)


def abstention_text(block: dict, split: str | None = None) -> str:
    """One line: what an all-abstaining eval block means ('the policy answers the abstention on every one of the
    64 test views: its accuracy 0.250 is the share of MISSING views ...')."""
    n = _num(block.get("n"))
    split = split or block.get("split")
    views = f"every one of the {int(n)} {split + ' ' if split else ''}views" if n else "every view"
    rels = {k: b for k, b in (block.get("per_relation") or {}).items() if isinstance(b, dict)}
    acc = _num(block.get("accuracy"))
    missing = rels.get(ABSTAINING_RELATION) or {}
    share = _num(missing.get("n")) / n if n and _num(missing.get("n")) is not None else None
    zero = [r for r in sorted(rels, key=_rel_order)
            if r != ABSTAINING_RELATION and _num(rels[r].get("accuracy")) == 0.0]
    text = f"the policy answers the abstention (\"unknown\") on {views}"
    if acc is not None and share is not None and abs(acc - share) < 1e-9:
        text += (f": its accuracy {acc:.3f} is only the share of {ABSTAINING_RELATION} views, where abstaining is "
                 "the right answer")
    elif acc is not None:
        text += f" (accuracy {acc:.3f})"
    if zero:
        text += f"; {', '.join(zero)} score 0"
    return text + ". This eval measures nothing that training did."


def _flat(config: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in (config or {}).items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _now(v) -> str:
    if isinstance(v, bool) or v is None:
        return ""
    return f" (now {v:,})" if isinstance(v, int) else f" (now {v})"


def abstention_fix(config: dict, rl: bool, warm_start: bool | None = None) -> str:
    """'fix: ...' for an all-abstaining run of this config (nested plan.config or already flattened). `rl`: an RL
    run; `warm_start`: an SFT run known to be the warm start of RL runs (None: not known)."""
    c = _flat(config) if any(isinstance(v, dict) for v in (config or {}).values()) else dict(config or {})
    steps, epochs = c.get("budget.sft_warm_start_steps"), c.get("budget.sft_warm_start_epochs")
    tokens = c.get("budget.max_completion_tokens")
    longer = (f"a longer SFT warm start so that RL starts from a policy that answers: raise "
              f"budget.sft_warm_start_steps{_now(steps)} or set budget.sft_warm_start_epochs{_now(epochs)}")
    more = f"a larger budget.max_completion_tokens{_now(tokens)} so that RL has room to move the policy"
    if rl and c.get("arm.init", "sft") == "sft":
        return f"fix: {longer}; or {more}."
    if rl:
        return (f"fix: {more}; or start RL from an SFT warm start (arm.init=sft, sized by budget.sft_warm_start_steps "
                "or budget.sft_warm_start_epochs).")
    steps_now = _now(c.get("budget.max_steps"))
    if warm_start:
        return (f"fix: a longer warm start: raise budget.sft_warm_start_steps{steps_now} or set "
                "budget.sft_warm_start_epochs on the RL runs' command line.")
    return (f"fix: train it longer: as the warm start of RL runs, raise budget.sft_warm_start_steps or set "
            f"budget.sft_warm_start_epochs; as an arm=sft run, raise budget.max_steps{steps_now} or "
            "budget.max_loss_tokens.")


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
    """For each condition with runs whose completion.json says the reward gave no update (harness.learning), what
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
