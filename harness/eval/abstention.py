"""An eval whose policy abstains everywhere: the rule, the sentence and the fix. Torch-free, no imports: the
console summary printed at the end of every run (harness.run.lifecycle) and the report (harness.report.signal) both
use it.

- `abstains_everywhere(block)`: an eval block (eval/<split>.json, completion.json's eval_after / eval_before) whose
  policy answered every view with the abstention: its `abstention_rate` is 1.0 (the share of views whose answer
  parsed to the abstention literal; with no overall rate, every relation's `per_relation` rate is 1.0). Its
  accuracy is then the share of MISSING views (where abstaining is the right answer: 0.250 on the synthetic data)
  and every other relation scores 0: the eval measures nothing training did. The rule reads the abstention rate
  itself, not "accuracy == the MISSING share", which a policy that answers can also reach by chance.
- `abstention_text(block)`: that, in one line; `abstention_fix(config, rl)`: what to change.
"""

from __future__ import annotations

import dataclasses
import math

RELATIONS_ORDER = ("FULL", "CONTROL", "MISSING", "SUBSTITUTE")
ABSTAINING_RELATION = "MISSING"  # the relation whose right answer is the abstention

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


_FIX_KNOBS = ("budget.sft_warm_start_steps", "budget.sft_warm_start_epochs", "budget.max_completion_tokens",
              "budget.max_steps", "arm.init")


def _fix_knobs(config) -> dict:
    """The knobs abstention_fix names, from a typed config (a plan's `cfg`: the fields it has; an arm without
    arm.init lacks it) or a JSON one (a run manifest's: nested, or already flattened)."""
    if dataclasses.is_dataclass(config):
        groups = {key: getattr(config, key.split(".")[0]) for key in _FIX_KNOBS}
        return {key: getattr(g, key.split(".")[1]) for key, g in groups.items() if hasattr(g, key.split(".")[1])}
    return _flat(config) if any(isinstance(v, dict) for v in (config or {}).values()) else dict(config or {})


def abstention_fix(config, rl: bool, warm_start: bool | None = None) -> str:
    """'fix: ...' for an all-abstaining run of this config: the plan's typed config (the run's summary), or a run
    manifest's JSON config (the report). `rl`: an RL run; `warm_start`: an SFT run known to be the warm start of
    RL runs (None: not known)."""
    c = _fix_knobs(config)
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
