"""`python -m harness --help`: usage, the config groups and every field's one-line help.

The text is generated from the dataclass schemas (harness/config/schema.py), so it cannot drift from
what compose accepts. Hydra substitutes $APP_CONFIG_GROUPS and $CONFIG itself.
"""

from __future__ import annotations

import dataclasses
import re

from arms import registry

USAGE = """harness: compare post-training arms ($ARMS) on the same model, data and budget.

Usage:
  python -m harness [group=option ...] [key=value ...]      train (default: arm=grpo model=tiny_vlm data=synthetic)
  python -m harness mode=plan [overrides]                   print the plan as JSON; writes nothing
  python -m harness run_mode=smoke [overrides]              self-test: checkpoint, die, resume, verify
  python -m harness -m arm=grpo,papo seed=0,1,2             multirun sweep
  python -m harness experiment=<name> [overrides]           a pinned combination (conf/experiment/<name>.yaml)
  python -m harness -m sweep=arms_x_seeds                   a named sweep (sweeps/<name>.yaml)
  python -m harness placement=ddp placement.num_processes=2  several ranks (accelerate launch as a child)
  python -m harness --cfg job [overrides]                   print the composed config
  python -m harness.verify RUN_DIR                          check a run directory's invariants
  python -m harness.eval RUN_DIR [split=val]                greedy eval of a finished run or checkpoint
  python -m harness.report DIR                              compare the runs under DIR

Examples:
  python -m harness debug=tiny output_root=/tmp/x
  python -m harness arm=papo arm.gamma=0.01 seed=1
  python -m harness -m experiment=comparison                every arm x 5 seeds under one token budget

`harness` (installed in .venv/bin) is the same command; with it, Hydra's tab completion works:
  eval "$(harness -sc install=bash)"                        then: harness arm=<TAB>, harness arm.<TAB>
"""


def _fmt_default(fld: dataclasses.Field) -> str:
    from omegaconf import MISSING

    if fld.default is not dataclasses.MISSING:
        d = fld.default
        if d is MISSING:
            return "required"
        return str(getattr(d, "value", d))
    if fld.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = fld.default_factory()  # type: ignore[misc]
        return "{...}" if dataclasses.is_dataclass(v) else str(v)
    return "required"


def fields_help() -> str:
    """Every schema field with its default and help, grouped by config group and option schema."""
    from harness.config.schema import SCHEMAS, Config, iter_fields

    lines = ["Fields (key: default  help):"]
    for path, fld in iter_fields(Config):
        if path.split(".")[0] not in SCHEMAS:  # groups are listed below, per option schema
            lines.append(f"  {path}: {_fmt_default(fld)}  {fld.metadata.get('help', '')}")
    for group, schemas in SCHEMAS.items():
        for name, cls in schemas.items():
            title = group if len(schemas) == 1 else f"{group} (schema {name})"
            lines.append(f"\n  [{title}]")
            for path, fld in iter_fields(cls):
                lines.append(f"  {group}.{path}: {_fmt_default(fld)}  {fld.metadata.get('help', '')}")
    return "\n".join(lines)


def groups_help() -> str:
    """The selectable options of each group, read from conf/ (Hydra's own list adds the schema groups)."""
    from harness.config.paths import CONF_DIR as conf, SWEEPS_DIR as sweeps
    rows = []
    for group in sorted(p for p in conf.iterdir() if p.is_dir()):
        if group.name == "hydra":  # Hydra's own groups (hydra/launcher=slurm): listed with the launchers
            for sub in sorted(p for p in group.iterdir() if p.is_dir()):
                own = ", ".join(sorted(y.stem for y in sub.glob("*.yaml")))
                extra = "; Hydra's own: basic, joblib" if sub.name == "launcher" else ""
                rows.append(f"  hydra/{sub.name} (with -m): {own}{extra}")
            continue
        options = ", ".join(sorted(y.stem for y in group.glob("*.yaml")))
        rows.append(f"  {group.name}: {options}")
    rows.append(f"  sweep (with -m): {', '.join(sorted(y.stem for y in sweeps.glob('*.yaml')))}")
    return "\n".join(rows)


def help_node() -> dict:
    """The hydra/help config node (stored as hydra/help=harness by schema.register)."""
    # Interpolations in defaults would be resolved by OmegaConf and then read by string.Template
    # (Hydra formats the template with it): show them as <key> instead.
    text = re.sub(r"\$\{([^}]*)\}", r"<\1>", fields_help()).replace("$", "$$")
    usage = USAGE.replace("$(", "$$(").replace("$ARMS", ", ".join(registry()))
    template = f"{usage}\n== Config groups (group=option) ==\n{groups_help()}\n\n{text}\n\n== Composed config ==\n$CONFIG\n"
    return {"app_name": "harness", "header": "", "footer": "", "template": template}
