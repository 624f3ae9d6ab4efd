"""port(): source recipe -> classified fields -> harness overrides, composed and planned in-process (torch-free).

    1. the user's harness overrides (--harness): a group they choose (model=tiny_vlm) replaces what the recipe
       says of it; data.path names the recipe's converted dataset
    2. the source's fields: schema defaults <- CONFIG.yaml <- KEY=VALUE overrides (unknown keys are problems)
    3. facts of the source (round shape, epochs -> steps with the harness dataset's size) and one Entry per field
    4. the overrides, the user's last, composed and planned as `python -m harness mode=plan` would; every
       ConfigError becomes a problem of the port
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from harness.errors import ConfigError, HarnessError, Problem
import harness.port.core as core

SOURCES = ("verl", "easyr1")
GROUPS = ("arm", "model", "data", "rollout", "placement", "logger", "budget", "debug")


def _rules(source: str):
    if source == "verl":
        import harness.port.verl as table
    else:
        import harness.port.easyr1 as table
    return table


def hydra_value(v: Any) -> str:
    """A value in Hydra's override grammar."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{hydra_value(str(k))}:{hydra_value(x)}" for k, x in v.items()) + "}"
    s = str(v)
    if s and all(c.isalnum() or c in "_./-@:~" for c in s) and s not in ("null", "true", "false") and s[0] != "~":
        return s
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _split(overrides: list[str]) -> list[tuple[str, str]]:
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        out.append((key.lstrip("+"), value if sep else ""))
    return out


def _n_train(argv: list[str]) -> Optional[int]:
    """Training rows of the harness dataset these overrides choose (synthetic: from its spec; jsonl: its records)."""
    from omegaconf import OmegaConf

    from harness.config.compose import compose
    from harness.data.spec import split_sizes

    try:
        cfg, _ = compose(argv)
    except HarnessError:
        return None
    d = OmegaConf.to_container(cfg.data, resolve=False)
    if d.get("name") == "synthetic":
        return split_sizes(d["n_base"], d["val_fraction"], d["test_fraction"])[0] * 4  # four views per base item
    records = Path(str(d.get("path") or "")) / "records" / f"{d.get('train_split', 'train')}.jsonl"
    if d.get("path") and records.is_file():
        with open(records, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    return None


def port(source: str, config: Optional[str], overrides: list[str], harness: list[str] | None = None) -> core.PortResult:
    harness = list(harness or [])
    problems: list[Problem] = []
    if source not in SOURCES:
        problems.append(Problem("SOURCE", source, "is not a source the port reads", f"use one of: {', '.join(SOURCES)}"))
        return core.PortResult(source, [], [], problems, {})
    user = _split(harness)
    replaced = {k for k, _ in user if k in ("model", "data")}
    src = core.Source(source)
    fields = core.load_source(src, config, overrides, problems)
    if any(p.field == "CONFIG" for p in problems):  # no recipe to port: its problem alone
        return core.PortResult(source, [], [], problems, {})
    ctx = core.Ctx(source, fields, replaced=replaced, problems=problems)
    user_path = next((v for k, v in user if k == "data.path"), None)
    if user_path:
        ctx.facts["user_data_path"] = user_path
    table = _rules(source)
    # the dataset the harness trains on decides how many optimizer steps the source's epochs are
    data_argv = [o for o in harness if o.split("=", 1)[0].lstrip("+").split(".")[0] in ("data", "model", "debug")]
    if user_path and "data" not in replaced:
        data_argv = ["data=jsonl", *data_argv]
    elif "data" not in replaced:
        first = fields.get("data.train_files")
        local = Path(str(first.value if first else "")).expanduser()
        data_argv = ["data=jsonl", f"data.path={local}"] if (local / "manifest.json").is_file() else None
    ctx.facts["n_train"] = _n_train(data_argv) if data_argv is not None else None
    if fields:
        table.prepare(ctx)
    entries = core.classify(fields, table.RULES, ctx)
    # the source starts RL from its model: no SFT warm start (the harness's default arm.init=sft)
    ctx.overrides.setdefault("arm", "grpo")
    ctx.set("arm.init", "scratch", "(the source starts RL from its model)")
    values = _merge(ctx.overrides, user)
    # a mapping (reward.kwargs) is a dict field of the schema: Hydra adds its keys only with `+`
    argv = [f"{'+' if isinstance(v, dict) and v else ''}{k}={hydra_value(v)}" for k, v in values.items()]
    own_data = any(p.field == "data.train_files" for p in problems)
    problems += [p for p in _plan_problems(argv) if not (own_data and p.field == "data.path")]
    unique = list({(p.field, repr(p.value), p.why): p for p in problems}.values())  # values may be lists or dicts
    return core.PortResult(source, entries, argv, unique, values)


def _merge(port_values: dict[str, Any], user: list[tuple[str, str]]) -> dict[str, Any]:
    """Groups first, then keys; the user's --harness overrides last and winning; a group the user chooses drops
    what the port derived for it (model=tiny_vlm: no model.family of the recipe's checkpoint)."""
    import yaml

    chosen = {k for k, _ in user if k in GROUPS}
    kept = {k: v for k, v in port_values.items() if k.split(".")[0] not in chosen or k == "arm"}
    if "arm" in chosen:
        kept.pop("arm")
    for k, raw in user:
        try:
            kept[k] = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError:
            kept[k] = raw
    order = sorted(kept, key=lambda k: (k not in GROUPS, GROUPS.index(k) if k in GROUPS else 0))
    return {k: kept[k] for k in order}


def _plan_problems(argv: list[str]) -> list[Problem]:
    from harness.config.compose import compose
    from harness.plan import build_plan

    try:
        cfg, choices = compose(argv)
        build_plan(cfg, choices, argv)
    except ConfigError as exc:
        return [Problem(p.field, p.value, f"the ported overrides do not plan: {p.why}", p.fix) for p in exc.problems]
    except HarnessError as exc:
        return [Problem("plan", None, str(exc).splitlines()[0], "see the harness's message")]
    return []


def render_json(result: core.PortResult) -> str:
    return json.dumps(result.to_json(), indent=2, default=str)
