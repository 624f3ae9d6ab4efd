"""Group runs, split them into conditions, summarize each condition over seeds, pair against a baseline.

- Group: runs with equal data identity (content_sha256, else the whole data identity without its
  paths) and model identity (files_sha256, else the whole model identity without its paths).
  Runs of different groups are never averaged or compared.
- Condition: within a group, runs whose semantic config (plan.config flattened, without `seed`
  and without the run's non_semantic_fields) is equal are seeds of one condition.
- Label: the arm; when several conditions of a group share an arm, the fields that differ among
  them (`papo (arm.gamma=0.5)`); `(warm start)` when a run of the condition is the SFT parent of
  another run in the set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from arms import registry
from harness.config.schema import BUILTIN_REWARD
from harness.identity import OMIT_AT_DEFAULT
from harness.metrics import EVAL_METRICS, OFFPOLICY_METRICS, PAIRED_METRICS, TRAIN_METRICS
from harness.report.runs import PATH_KEYS, Run, budget_kind
from harness.report.stats import mean_ci, paired_bootstrap

ARM_ORDER = tuple(registry())  # the registry's order (arms.ORDER, then new arms by name)
LABEL_FIELDS_MAX = 4



def _short(h: object) -> str:
    return str(h)[:12] if h is not None else "none"


def _strip_paths(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in PATH_KEYS}


def data_key(run: Run) -> str:
    d = run.identity.get("data") or {}
    if d.get("content_sha256"):
        return "content_sha256=" + d["content_sha256"]
    return json.dumps(_strip_paths(d), sort_keys=True)


def model_key(run: Run) -> str:
    m = run.identity.get("model") or {}
    if m.get("files_sha256"):
        return "files_sha256=" + m["files_sha256"]
    return json.dumps(_strip_paths(m), sort_keys=True)


def describe_key(key: str) -> str:
    """A short human form of a data/model key: the hash prefix, or the fields that make it up."""
    if "=" in key and not key.startswith("{"):
        name, value = key.split("=", 1)
        return f"{name} {value[:12]}"
    d = json.loads(key)
    parts = [f"{k}={_short(v) if k.endswith('sha256') else v}" for k, v in d.items() if not isinstance(v, dict)]
    return ", ".join(parts) or "empty identity"


@dataclass
class Condition:
    key: str
    arm: str
    semantic: dict
    runs: list[Run]
    label: str = ""
    fields: dict = field(default_factory=dict)  # the fields that tell it apart from same-arm conditions
    warm_start: bool = False
    duplicates: list[Run] = field(default_factory=list)  # second runs of a seed: listed, not averaged
    summary: dict = field(default_factory=dict)

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.runs]

    @property
    def rl(self) -> bool:
        return any(r.curve is not None for r in self.runs)

    def value(self, metric: str, seed) -> float | None:
        for r in self.runs:
            if r.seed == seed:
                return r.metrics.get(metric)
        return None


@dataclass
class Group:
    index: int
    data: str
    model: str
    conditions: list[Condition]
    baseline: Condition | None = None
    baseline_note: str = ""
    paired: list[dict] = field(default_factory=list)
    unpaired: list[dict] = field(default_factory=list)  # conditions left out of the paired table, and why


def _arm_rank(arm: str) -> tuple:
    return (ARM_ORDER.index(arm), "") if arm in ARM_ORDER else (len(ARM_ORDER), arm)


def _natural(value: object) -> tuple:
    """Numbers numerically, then everything else as text (so 8 < 20 and 0.25 < 0.5 in labels)."""
    if isinstance(value, bool) or value is None:
        return (1, str(value))
    if isinstance(value, (int, float)):
        return (0, float(value))
    return (1, str(value))


_ABSENT = object()


def _resolved(key: str, v: object) -> object:
    """A field a condition lacks because it holds the value runs had before the field existed (left out of the
    hashes and of Run.semantic: harness.identity.OMIT_AT_DEFAULT) is that value; any other absent field stays absent."""
    return OMIT_AT_DEFAULT[key] if v is _ABSENT and key in OMIT_AT_DEFAULT else v


def _fmt_value(v: object, key: str = "") -> str:
    v = _resolved(key, v)
    if v is _ABSENT:
        return "–"
    if key.endswith("_target_") and v == BUILTIN_REWARD:
        return "built-in"
    if key.endswith("_target_") and isinstance(v, str) and "/" in v.split(":")[0]:
        return v.rsplit("/", 1)[1]  # a reward file's path: its name says which in a label (report.json has all)
    if isinstance(v, str):
        return v
    return json.dumps(v)


def jsonable_fields(fields: dict) -> dict:
    """A condition's distinguishing fields for report.json (a field the condition lacks -> None)."""
    return {k: (None if _resolved(k, v) is _ABSENT else _resolved(k, v)) for k, v in fields.items()}


def _label(cond: Condition, same_arm: list[Condition]) -> None:
    if len(same_arm) > 1:
        keys = sorted(set().union(*(c.semantic for c in same_arm)))
        differing = [k for k in keys
                     if len({json.dumps(c.semantic.get(k, "<absent>"), sort_keys=True) for c in same_arm}) > 1]
        cond.fields = {k: cond.semantic.get(k, _ABSENT) for k in differing}
    parts = [f"{k}={_fmt_value(v, k)}" for k, v in cond.fields.items()]
    if len(parts) > LABEL_FIELDS_MAX:
        parts = parts[:LABEL_FIELDS_MAX] + [f"+{len(parts) - LABEL_FIELDS_MAX} more"]
    cond.label = cond.arm + (f" ({', '.join(parts)})" if parts else "") + (" (warm start)" if cond.warm_start else "")


def build_conditions(runs: list[Run], parents: set[str]) -> list[Condition]:
    by_key: dict[str, Condition] = {}
    for run in runs:
        key = json.dumps(run.semantic, sort_keys=True, default=str)
        cond = by_key.setdefault(key, Condition(key=key, arm=run.arm, semantic=run.semantic, runs=[]))
        if run.seed in cond.seeds:
            cond.duplicates.append(run)
        else:
            cond.runs.append(run)
        cond.warm_start |= run.name in parents
    conds = list(by_key.values())
    for c in conds:
        c.runs.sort(key=lambda r: _natural(r.seed))
        _label(c, [o for o in conds if o.arm == c.arm])
    # Fixed arm order, then by label with its field values compared naturally.
    # A field left out at its default (OMIT_AT_DEFAULT) sorts as that value: rollout.lag 0, 1, 2, 4, not 0, 2, 4, 1.
    conds.sort(key=lambda c: (_arm_rank(c.arm), tuple(_natural(None if (r := _resolved(k, v)) is _ABSENT else r)
                                                      for k, v in c.fields.items()), c.label))
    return conds


def build_groups(runs: list[Run]) -> list[Group]:
    """Complete runs -> groups by data/model identity -> conditions, each summarized over seeds."""
    parents = {r.parent for r in runs if r.parent}
    keyed: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        keyed.setdefault((data_key(r), model_key(r)), []).append(r)
    # Larger groups first: the main comparison reads first.
    order = sorted(keyed, key=lambda k: (-len(keyed[k]), k))
    groups = []
    for i, k in enumerate(order, 1):
        conds = build_conditions(keyed[k], parents)
        for c in conds:
            c.summary = summarize(c)
        groups.append(Group(index=i, data=k[0], model=k[1], conditions=conds))
    return groups


def summarize(cond: Condition) -> dict:
    out = {}
    for key, _ in EVAL_METRICS + TRAIN_METRICS + OFFPOLICY_METRICS:
        vals = [(r.seed, r.name, r.metrics.get(key)) for r in cond.runs]
        s = mean_ci([v for _, _, v in vals])
        s["values"] = [{"seed": seed, "run": name, "value": v} for seed, name, v in vals if v is not None]
        out[key] = s
    stopped: dict[str, int] = {}
    for r in cond.runs:
        sb = str((r.completion or {}).get("stopped_by"))
        stopped[sb] = stopped.get(sb, 0) + 1
    out["stopped_by"] = stopped
    return out


# --- baseline and paired comparison


def _normal(s: str) -> str:
    return re.sub(r"\s+", "", s)


def resolve_baseline(group: Group, wanted: str) -> None:
    by_label = [c for c in group.conditions if _normal(c.label) == _normal(wanted)]
    by_arm = [c for c in group.conditions if c.arm == wanted]
    labels = ", ".join(f"`{c.label}`" for c in by_arm)
    if len(by_label) == 1:
        group.baseline = by_label[0]
    elif len(by_arm) == 1:
        group.baseline = by_arm[0]
    elif len(by_arm) > 1:
        group.baseline_note = (f"baseline `{wanted}` is ambiguous: {len(by_arm)} conditions have arm {wanted} "
                               f"({labels}); no paired comparison. Pick one with `--baseline \"<label>\"`.")
    else:
        have = ", ".join(f"`{c.label}`" for c in group.conditions)
        group.baseline_note = (f"baseline `{wanted}` is not among this group's conditions ({have}); "
                               f"no paired comparison. Pick one with `--baseline <arm or label>`.")


def kind(cond: Condition) -> str:
    """'loss' for an SFT-kind condition (a loss-token budget), 'sampled' for an RL one."""
    return budget_kind(cond.runs[0])


def paired(group: Group) -> list[dict]:
    """For every non-baseline condition and metric: differences on the seeds both have, bootstrapped. Against an RL
    baseline, SFT-kind conditions (a warm start, an arm=sft run: trained on loss tokens, not sampled ones) are left
    out and listed in group.unpaired: an RL run's difference to its own warm start is already its `change` column.
    Naming an SFT condition as the baseline (--baseline sft) pairs every condition against it."""
    base = group.baseline
    group.unpaired = []
    if base is None:
        return []
    rows = []
    for cond in group.conditions:
        if cond is base:
            continue
        if kind(cond) == "loss" and kind(base) == "sampled":
            group.unpaired.append({
                "condition": cond.label, "baseline": base.label, "reason": "sft_vs_rl_baseline",
                "why": (f"an SFT condition ({'the warm start of the RL runs, ' if cond.warm_start else ''}trained on "
                        f"loss tokens) is not paired against the RL baseline `{base.label}`: their budgets are not "
                        "the same kind" + ("; each RL run's difference to its warm start is its `change` column"
                                           if cond.warm_start else "")),
                "fix": f"to compare against it, name it as the baseline: --baseline \"{cond.label}\""})
            continue
        for metric in PAIRED_METRICS:
            seeds, diffs = [], []
            for seed in cond.seeds:
                a, b = cond.value(metric, seed), base.value(metric, seed)
                if seed is not None and a is not None and b is not None:
                    seeds.append(seed)
                    diffs.append(a - b)
            if not seeds and any(all(r.metrics.get(metric) is None for r in c.runs) for c in (cond, base)):
                continue  # the metric does not exist for one side (e.g. the train reward of SFT)
            boot = paired_bootstrap(diffs)
            rows.append({"condition": cond.label, "baseline": base.label, "metric": metric, "seeds": seeds,
                         "diffs": diffs, **boot})
    return rows
