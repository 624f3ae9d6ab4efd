"""Checkpoints: publish harness_checkpoint.json last, find complete ones, apply retention. Torch-free.

A checkpoint directory (checkpoints/checkpoint-<step>/) written by the Trainer counts only once
`harness_checkpoint.json` is published in it, last and atomically. It lists every file with its
digest and size, the accounting frontier (ledgers, traces, metrics), the training-state digests
the resume audit compares, and the run's identity. Retention keeps the latest `keep_last`
complete checkpoints plus the permanent ones (final).

Digest format (the manifest's "digests"): 2, xxh3-128 with each byte hashed once (harness.accounting.filedigest,
harness.accounting.tensorfiles); absent, 1: sha256 of whole files and of the state (checkpoints written before).
Both verify and resume; a new checkpoint is always written in format 2.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from harness.accounting.filedigest import ALGORITHM, FORMAT, file_digest
from harness.identity import sha256_file
from harness.rundir import atomic_write_json, fsync_dir, identity_diffs, now, read_json

CHECKPOINT_MANIFEST = "harness_checkpoint.json"
CHECKPOINTS_DIR = "checkpoints"
_STEP_RE = re.compile(r"checkpoint-(\d+)$")
log = logging.getLogger("harness")


def file_digests(ckpt_dir: Path, digest=file_digest) -> dict[str, dict[str, Any]]:
    """Every file's format-2 digest, read from the file; `digest(path)`: another way to the same value (the training
    process's Recorder, which lends the digests it took in memory: Recorder.checkpoint_files)."""
    return {
        str(p.relative_to(ckpt_dir)): {ALGORITHM: digest(p), "size": p.stat().st_size}
        for p in sorted(ckpt_dir.rglob("*"))
        if p.is_file() and p.name != CHECKPOINT_MANIFEST and not p.name.endswith(".tmp")
    }


def recorded_digest(meta: dict) -> tuple[str, str]:
    """(algorithm, digest) of one file's manifest entry: format 2's xxh3, or format 1's sha256."""
    return (ALGORITHM, meta[ALGORITHM]) if ALGORITHM in meta else ("sha256", meta["sha256"])


def digest_on_disk(path: Path, algorithm: str) -> str:
    return file_digest(path) if algorithm == ALGORITHM else sha256_file(path)


def publish(ckpt_dir: Path, *, step: int, identity: dict, frontier: dict, state: dict, totals: dict,
            permanent: bool, rank_totals: dict | None = None, kept: str | None = None,
            files: dict | None = None) -> dict:
    """Write harness_checkpoint.json last: from now on the checkpoint counts. `permanent`: the run's final one;
    `kept`: why retention must not remove it either ("eval": a periodic eval scored its weights). `files`: the
    digests of every file, when the training process took them as it wrote (else read from the files here)."""
    manifest = {
        "version": 1,
        "digests": FORMAT,
        "step": step,
        "created_at": now(),
        "permanent": permanent,
        **({"kept": kept} if kept else {}),
        "identity": {k: identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model", "teacher", "code")},
        "files": file_digests(ckpt_dir) if files is None else files,
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


def checkpoint_problems(ckpt_dir: Path, *, deep: bool = True, identity: dict | None = None,
                        digest=digest_on_disk) -> list[str]:
    """Why a checkpoint does not count (empty when it is complete and intact). With the run's `identity` (its
    manifest's), also a checkpoint of another run: another semantic config, dataset or model. `digest(path,
    algorithm)`: the file's digest on disk (harness.run.stages.resume.CheckAhead: taken ahead, on a thread), or None
    where it is not known yet (that file is then not judged here)."""
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
        elif deep:
            algorithm, want = recorded_digest(meta)
            got = digest(p, algorithm)
            if got is not None and got != want:  # None: not known yet (harness.run.stages.resume.find: confirmed later)
                out.append(f"{ckpt_dir.name}/{rel}: {algorithm} differs from the recorded digest")
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
