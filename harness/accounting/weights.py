"""A saved policy's identity, torch-free: which directories hold a policy, which of their files are weights, and
the digest of those weights (what a plan records of a teacher or an init, what an eval binds its result to, what
verify compares). Below the plan: the planner, the arms' plan-time checks and verify read it without the training
side (harness.policy re-exports every name, its documented import path).
"""

from __future__ import annotations

from pathlib import Path

from harness.identity import sha256_file
from harness.rundir import read_json

POLICY_MANIFEST = "harness_policy.json"  # final_policy's manifest (harness.policy.save_final_policy)


#: a directory holding one of these is a policy the harness can start from or distill from: full weights
#: (config.json) or a PEFT adapter (adapter_config.json)
POLICY_FILES = ("config.json", "adapter_config.json")


def is_policy_dir(path: str | Path) -> bool:
    """Whether `path` holds a policy (arm.init=<path>, opd's arm.teacher=<path>): POLICY_FILES. Torch-free."""
    return any((Path(path) / name).is_file() for name in POLICY_FILES)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
NOT_WEIGHTS = ("optimizer", "scheduler", "rng_state", "training_args")


def weights_digest(path: str | Path) -> str | None:
    """sha256 over the policy's weight files as recorded by its manifest (final_policy's harness_policy.json
    or a checkpoint's harness_checkpoint.json); None when the directory has no harness manifest."""
    from harness.accounting.checkpoint import CHECKPOINT_MANIFEST
    from harness.identity import canonical_json, sha256_text

    path = Path(path)
    for name in (POLICY_MANIFEST, CHECKPOINT_MANIFEST):
        if (path / name).is_file():
            manifest = read_json(path / name)
            files, base = manifest.get("files") or {}, set(manifest.get("base_files") or ())  # a LoRA's copied base
            # a checkpoint's files carry their xxh3 (digest format 2) or sha256 (format 1, and final_policy's)
            weights = {k: v.get("xxh3") or v["sha256"] for k, v in files.items() if is_weight_file(k) and k not in base}
            return sha256_text(canonical_json(weights)) if weights else None
    return None


def is_weight_file(rel: str) -> bool:
    return rel.endswith(WEIGHT_SUFFIXES) and not Path(rel).name.startswith(NOT_WEIGHTS)


def weights_digest_of_files(path: str | Path, file_digest=None) -> str | None:
    """weights_digest of a directory's weight files as they are on disk; the same value weights_digest gives once
    its manifest is published, given the digest its manifest records: a checkpoint's (the periodic eval's weights,
    before the manifest; by default read from the file, in the training process the Recorder's, which publish then
    reuses: no file is hashed twice), or `sha256_file` for final_policy."""
    from harness.accounting.filedigest import file_digest as checkpoint_file_digest
    from harness.identity import canonical_json, sha256_text

    path = Path(path)
    file_digest = file_digest or checkpoint_file_digest
    weights = {str(p.relative_to(path)): file_digest(p) for p in sorted(path.rglob("*"))
               if p.is_file() and is_weight_file(str(p.relative_to(path)))}
    return sha256_text(canonical_json(weights)) if weights else None


def final_policy_identity(run_dir: str | Path) -> dict:
    """What a plan records of another run's final policy (opd's teacher): its directory, the digest of its weight
    files, that run's arm and semantic identity, and its final eval. Torch-free. A run that has not completed
    has no final policy yet: then weights_sha256 and the eval are None (filled once it has run)."""
    import json

    run = Path(run_dir)
    path = (run / "final_policy").resolve()
    done = (run / "completion.json").is_file()
    out = {"path": str(path), "weights_sha256": weights_digest_of_files(path, sha256_file) if done else None,
           "run_name": run.name, "arm": None, "semantic_sha256": None, "eval_accuracy": None, "eval_split": None}
    if (run / "run_manifest.json").is_file():
        plan = json.loads((run / "run_manifest.json").read_text())["plan"]
        out.update(arm=plan["config"]["arm"]["name"], semantic_sha256=plan["identity"]["semantic_sha256"])
    if done:
        after = json.loads((run / "completion.json").read_text()).get("eval_after") or {}
        out.update(eval_accuracy=after.get("accuracy"), eval_split=after.get("split"))
    return out
