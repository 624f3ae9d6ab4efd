"""Checkpoints: publish harness_checkpoint.json last, find complete ones, apply retention. Torch-free.

A checkpoint directory (checkpoints/checkpoint-<step>/) written by the Trainer counts only once
`harness_checkpoint.json` is published in it, last and atomically. It lists every file with its
sha256 and size, the accounting frontier (ledgers, traces, metrics), the training-state digests
the resume audit compares, and the run's identity. Retention keeps the latest `keep_last`
complete checkpoints plus the permanent ones (final).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from harness.identity import sha256_file
from harness.rundir import atomic_write_json, fsync_dir, identity_diffs, now, read_json

CHECKPOINT_MANIFEST = "harness_checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
_STEP_RE = re.compile(r"checkpoint-(\d+)$")
log = logging.getLogger("harness")


def file_digests(ckpt_dir: Path) -> dict[str, dict[str, Any]]:
    return {
        str(p.relative_to(ckpt_dir)): {"sha256": sha256_file(p), "size": p.stat().st_size}
        for p in sorted(ckpt_dir.rglob("*"))
        if p.is_file() and p.name != CHECKPOINT_MANIFEST and not p.name.endswith(".tmp")
    }


def publish(ckpt_dir: Path, *, step: int, identity: dict, frontier: dict, state: dict, totals: dict,
            permanent: bool, rank_totals: dict | None = None, kept: str | None = None) -> dict:
    """Write harness_checkpoint.json last: from now on the checkpoint counts. `permanent`: the run's final one;
    `kept`: why retention must not remove it either ("eval": a periodic eval scored its weights)."""
    manifest = {
        "version": 1,
        "step": step,
        "created_at": now(),
        "permanent": permanent,
        **({"kept": kept} if kept else {}),
        "identity": {k: identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model", "teacher", "code")},
        "files": file_digests(ckpt_dir),
        "frontier": frontier,
        "state_digests": state,
        "totals": totals,  # all ranks together
        **({"rank_totals": rank_totals} if rank_totals else {}),  # multi-process: each rank's own counters
    }
    atomic_write_json(ckpt_dir / CHECKPOINT_MANIFEST, manifest)
    return manifest


def step_of(path: Path) -> int | None:
    m = _STEP_RE.search(path.name)
    return int(m.group(1)) if m else None


def checkpoint_problems(ckpt_dir: Path, *, deep: bool = True, identity: dict | None = None) -> list[str]:
    """Why a checkpoint does not count (empty when it is complete and intact). With the run's `identity` (its
    manifest's), also a checkpoint of another run: another semantic config, dataset or model."""
    mpath = ckpt_dir / CHECKPOINT_MANIFEST
    if not mpath.is_file():
        return [f"{ckpt_dir.name}: no {CHECKPOINT_MANIFEST} (torn: the save did not finish)"]
    try:
        manifest = read_json(mpath)
    except (OSError, ValueError) as exc:
        return [f"{ckpt_dir.name}: unreadable {CHECKPOINT_MANIFEST} ({exc})"]
    out = [f"{ckpt_dir.name}: {CHECKPOINT_MANIFEST} is of another run ({d.field} {str(d.actual)[:12]}, the run's "
           f"{str(d.expected)[:12]})" for d in identity_diffs(identity, manifest.get("identity") or {})] if identity else []
    if manifest.get("step") != step_of(ckpt_dir):
        out.append(f"{ckpt_dir.name}: {CHECKPOINT_MANIFEST} says step {manifest.get('step')}")
    for rel, meta in (manifest.get("files") or {}).items():
        p = ckpt_dir / rel
        if not p.is_file():
            out.append(f"{ckpt_dir.name}/{rel}: missing")
        elif p.stat().st_size != meta["size"]:
            out.append(f"{ckpt_dir.name}/{rel}: size {p.stat().st_size} != recorded {meta['size']}")
        elif deep and sha256_file(p) != meta["sha256"]:
            out.append(f"{ckpt_dir.name}/{rel}: sha256 differs from the recorded digest")
    return out


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS_DIR
    found = [p for p in root.glob("checkpoint-*") if p.is_dir() and step_of(p) is not None] if root.is_dir() else []
    return sorted(found, key=step_of)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints with a published manifest, oldest first (digests are checked by resume/verify)."""
    return [p for p in list_checkpoints(run_dir) if (p / CHECKPOINT_MANIFEST).is_file()]


def apply_retention(run_dir: Path, keep_last: int) -> list[str]:
    """Keep the permanent and the kept checkpoints and the latest `keep_last` others; delete the rest. (The final
    checkpoint is permanent, and those of periodic evals kept: neither counts against keep_last, so a finished run
    keeps keep_last resumable points before its end.)"""
    clean_removals(run_dir)
    manifests = {p: read_json(p / CHECKPOINT_MANIFEST) for p in complete_checkpoints(run_dir)}
    others = [p for p, m in manifests.items() if not (m.get("permanent") or m.get("kept"))]
    removed = []
    for p in others[:-keep_last] if keep_last > 0 else others:
        # Out of the checkpoint namespace first (one atomic rename), then delete: a process killed in the
        # middle of rmtree would otherwise leave a published manifest over missing files.
        doomed = p.with_name(f".removing-{p.name}")
        os.replace(p, doomed)
        fsync_dir(p.parent)
        shutil.rmtree(doomed)
        removed.append(p.name)
    return removed


def clean_removals(run_dir: Path) -> None:
    """Finish removals that a killed process left half done (renamed out of the namespace, not yet deleted)."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    for stale in root.glob(".removing-checkpoint-*") if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)
