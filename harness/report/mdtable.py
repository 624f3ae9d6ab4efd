"""A markdown table (harness.report.render and render_stats); a `|` inside a cell is escaped."""

from __future__ import annotations


def md_escape(text: str) -> str:
    return str(text).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return out
