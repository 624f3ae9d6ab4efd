"""Greedy evaluation: the library (greedy: generate, score, write the artifact) and the CLI
`python -m harness.eval RUN_DIR ...` (cli). The artifact's name is decided here, once. Torch-free."""

from __future__ import annotations

from pathlib import Path


def artifact_name(split: str, label: str) -> str:
    """eval/<name>.json: `<split>` for the final policy, `<split>-<label>` otherwise (before, checkpoint-N)."""
    return split if label == "final" else f"{split}-{label}"


def artifact_path(run_dir: str | Path, split: str, label: str) -> Path:
    return Path(run_dir) / "eval" / f"{artifact_name(split, label)}.json"
