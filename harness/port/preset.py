"""The port's two outputs besides JSON: the readable table, and a Hydra experiment preset (conf/experiment/
convention: `# @package _global_`, a header with the command, group overrides in `defaults`, keys, and the report
as comments). Torch-free."""

from __future__ import annotations

import collections
from pathlib import Path

from harness.port.core import CLASSES, PortResult
from harness.port.pipeline import GROUPS


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _listed(e) -> bool:
    return e.origin != "default" or e.harness is not None or e.cls not in ("informational_only", "distributed_only")


def summary(result: PortResult) -> str:
    counts = collections.Counter(e.cls for e in result.entries)
    by = ", ".join(f"{c} {counts[c]}" for c in CLASSES if counts[c])
    return (f"{result.source}: {len(result.entries)} fields ({by}) -> {len(result.overrides)} harness overrides; "
            f"runnable: {'yes' if result.runnable else 'no'}")


def report_lines(result: PortResult, every: bool = True) -> list[str]:
    rows = [e for e in result.entries if every or _listed(e)]
    width = max([len(e.field) for e in rows] + [5])
    lines = [f"{'field':<{width}}  {'value':<40}  {'class':<23}  {'harness':<28}  note"]
    for e in rows:
        lines.append(f"{e.field:<{width}}  {_short(e.value):<40}  {e.cls:<23}  {e.harness or '-':<28}  {e.note}")
    hidden = [e for e in result.entries if e not in rows]
    if hidden:
        counts = collections.Counter(e.cls for e in hidden)
        lines.append(f"... and {len(hidden)} fields at the source's default that change nothing here ("
                     + ", ".join(f"{c} {n}" for c, n in sorted(counts.items())) + "; --all or --json lists them)")
    return lines


def render_table(result: PortResult, every: bool = False) -> str:
    out = [summary(result), ""] + report_lines(result, every)
    out += ["", "harness overrides:", "  " + " ".join(result.overrides) if result.overrides else "  (none)"]
    return "\n".join(out)


def preset_text(result: PortResult, name: str, command: str) -> str:
    import yaml

    groups = [(k, v) for k, v in result.values.items() if k in GROUPS]
    nested: dict = {}
    for key, value in result.values.items():
        if key in GROUPS:
            continue
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    head = [
        "# @package _global_",
        f"# Ported from the {result.source} recipe below by harness.port: every field of the source is classified in the report",
        "# below (exact, semantically_conformant, locally_lowered, informational_only, distributed_only,",
        "# not_implemented, unsupported); its overrides composed and planned when it was written:",
        f"#   {command}",
        f"# Run it (this file in conf/experiment/): python -m harness experiment={name} [overrides]",
        f"#   overrides: {' '.join(result.overrides)}",
    ]
    body = []
    if groups:
        body.append("defaults:")
        body += [f"  - override /{k}: {v}" for k, v in groups]
    if nested:
        body.append(yaml.safe_dump(nested, sort_keys=False, default_flow_style=False, width=120).rstrip())
    report = ["", f"# --- report: {summary(result)}"]
    report += ["# " + line for line in report_lines(result, every=True)]
    return "\n".join(head + body + report) + "\n"


def write_preset(result: PortResult, out: str, command: str) -> Path:
    path = Path(out)
    text = preset_text(result, path.stem, command)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
