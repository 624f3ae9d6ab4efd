"""Greedy evaluation: the library (greedy: generate, score, write the artifact) and the CLI
`python -m harness.eval RUN_DIR ...` (cli). The artifact's name is decided here, once. Torch-free."""

from __future__ import annotations

from pathlib import Path


def artifact_name(split: str, label: str) -> str:
    """eval/<name>.json: `<split>` for the final policy, `<split>-<label>` otherwise (before, checkpoint-N)."""
    return split if label == "final" else f"{split}-{label}"


def artifact_path(run_dir: str | Path, split: str, label: str) -> Path:
    return Path(run_dir) / "eval" / f"{artifact_name(split, label)}.json"


def periodic_evals(run_dir: str | Path, split: str) -> list[dict]:
    """The periodic evals of a run (train.eval_steps: eval/<split>-checkpoint-N.json with a `step`), by step;
    a later `python -m harness.eval RUN_DIR policy=checkpoint-N` (no `step`) is not one. Unreadable ones are
    left out (harness.verify names them)."""
    import json

    out = []
    for p in (Path(run_dir) / "eval").glob(f"{split}-checkpoint-*.json"):
        try:
            res = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(res, dict) and isinstance(res.get("step"), int):
            out.append({**res, "artifact": p.name})
    return sorted(out, key=lambda r: r["step"])


def decoding(max_new_tokens: int, batch_size: int) -> dict:
    """An eval artifact's `decoding`: greedy, and the settings that change its completions (the batch size
    through padding)."""
    return {"greedy": True, "max_new_tokens": max_new_tokens, "batch_size": batch_size}


#: What must be equal for an eval artifact to stand for another evaluation of the same weights: the
#: weights (digest), the rows (data digest, split, max_items), the decoding (greedy, max_new_tokens, batch
#: size: padding changes a batch's numerics), the scoring (the reward config and its functions' source digests) and
#: the code.
REUSE_KEYS = ("policy_sha256", "data_sha256", "split", "max_items", "decoding", "reward", "reward_sources", "code")


def reuse_settings(result: dict) -> dict:
    """The REUSE_KEYS an eval artifact records (an older artifact lacks some: it is never reused)."""
    out = {k: result[k] for k in REUSE_KEYS if k in result}
    if "code" in (result.get("identity") or {}):
        out["code"] = result["identity"]["code"]
    return out


def reuse_mismatches(stored: dict, wanted: dict) -> list[str]:
    """The settings in which a stored artifact differs from the evaluation wanted ([] = reusable). Weights
    without a digest are never the same weights."""
    have = reuse_settings(stored)
    return [k for k in REUSE_KEYS if k not in have or have[k] != wanted.get(k)
            or (k == "policy_sha256" and wanted.get(k) is None)]
