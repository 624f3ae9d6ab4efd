"""`python -m harness.verify RUN_DIR`: torch-free check of a run directory's invariants.

Exit 0 when every invariant holds; otherwise exit 1 and list every violation (not just the first).
Each check is a function (run_dir, manifest) -> list of violation strings, registered in CHECKS;
later stages (accounting, checkpoints, audits, eval) add theirs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

from harness.identity import config_hashes
from harness.plan import RUN_NAME_HASH_LEN
from harness.rundir import MANIFEST, STATUSES

REQUIRED = ("manifest_version", "run_name", "status", "created_at", "updated_at", "identity", "plan", "events")

Check = Callable[[Path, dict], list[str]]


def check_manifest_fields(run_dir: Path, m: dict) -> list[str]:
    out = [f"{MANIFEST}: missing key {k!r}" for k in REQUIRED if k not in m]
    if m.get("status") not in STATUSES:
        out.append(f"{MANIFEST}: status {m.get('status')!r} is not one of {', '.join(STATUSES)}")
    events = m.get("events") or []
    if not events:
        out.append(f"{MANIFEST}: no events recorded")
    elif events[-1].get("status") != m.get("status"):
        out.append(f"{MANIFEST}: status {m.get('status')!r} but the last event says {events[-1].get('status')!r}")
    return out


def check_identity(run_dir: Path, m: dict) -> list[str]:
    out: list[str] = []
    ident, plan = m.get("identity") or {}, m.get("plan") or {}
    planned = plan.get("identity") or {}
    for key in ("config_sha256", "semantic_sha256", "non_semantic_fields"):
        if planned.get(key) != ident.get(key):
            out.append(f"{MANIFEST}: identity.{key} differs from plan.identity.{key}")
    for part in ("data", "model"):  # later stages may fill what the plan left open, never change it
        for key, value in (planned.get(part) or {}).items():
            if value is not None and (ident.get(part) or {}).get(key) != value:
                out.append(f"{MANIFEST}: identity.{part}.{key} differs from what the plan recorded")
    config = plan.get("config")
    if not isinstance(config, dict):
        return out + [f"{MANIFEST}: plan.config is missing"]
    cfg_sha, sem_sha = config_hashes(config, ident.get("non_semantic_fields") or [])
    if cfg_sha != ident.get("config_sha256"):
        out.append(f"{MANIFEST}: identity.config_sha256 {ident.get('config_sha256')} != sha256 of plan.config {cfg_sha}")
    if sem_sha != ident.get("semantic_sha256"):
        out.append(f"{MANIFEST}: identity.semantic_sha256 {ident.get('semantic_sha256')} != recomputed {sem_sha}")
    name = m.get("run_name", "")
    if name != run_dir.name:
        out.append(f"{MANIFEST}: run_name {name!r} does not match the directory name {run_dir.name!r}")
    if plan.get("run_name") != name:
        out.append(f"{MANIFEST}: plan.run_name {plan.get('run_name')!r} != run_name {name!r}")
    if not name.endswith("-" + str(ident.get("semantic_sha256", ""))[:RUN_NAME_HASH_LEN]):
        out.append(f"{MANIFEST}: run_name {name!r} does not end with the semantic hash prefix")
    return out


def check_completion(run_dir: Path, m: dict) -> list[str]:
    if m.get("status") == "completed" and not (run_dir / "completion.json").is_file():
        return ["status is completed but completion.json is missing"]
    return []


def check_no_torn_writes(run_dir: Path, m: dict) -> list[str]:
    return [f"leftover temp file from an interrupted atomic write: {p.relative_to(run_dir)}"
            for p in run_dir.rglob(".*.tmp")]


def check_lock(run_dir: Path, m: dict) -> list[str]:
    """run.lock holds its last holder's record (or nothing); other bytes there are not the harness's."""
    from harness.rundir import LOCK, lock_problem

    p = run_dir / LOCK
    why = lock_problem(p.read_bytes()) if p.is_file() else None
    return [f"{LOCK}: {why}; fix: delete it when no process runs on this dir (a claim writes a new one)"] if why else []


def _training_checks() -> list[Check]:
    from harness.verify.training import CHECKS as TRAINING

    return list(TRAINING)


CHECKS: list[Check] = [check_manifest_fields, check_identity, check_completion, check_no_torn_writes, check_lock,
                       *_training_checks()]


def verify(run_dir: str | Path) -> list[str]:
    """Every violation found in `run_dir` (empty when it is consistent)."""
    run_dir = Path(run_dir).resolve()  # `verify .` names the directory too
    if not run_dir.is_dir():
        return [f"{run_dir} is not a directory"]
    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [f"{MANIFEST} is missing: {run_dir} is not a run directory (or its claim never completed)"]
    except (ValueError, UnicodeDecodeError) as exc:
        return [f"{MANIFEST} is not valid JSON: {exc}"]
    if not isinstance(manifest, dict):
        return [f"{MANIFEST} is not a JSON object"]
    out: list[str] = []
    for check in CHECKS:
        out.extend(check(run_dir, manifest))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.verify", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run directory (<output_root>/runs/<run_name>)")
    args = ap.parse_args(argv)
    violations = verify(args.run_dir)
    if violations:
        print(f"{len(violations)} violation(s) in {args.run_dir}:", file=sys.stderr)
        for v in violations:
            print(f"  - {v}", file=sys.stderr)
        return 1
    status = json.loads((Path(args.run_dir) / MANIFEST).read_text())["status"]
    print(f"ok: {args.run_dir} (status {status}; {len(CHECKS)} checks passed)")
    return 0

