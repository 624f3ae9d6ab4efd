"""Plan: a composed config turned into a frozen, hashed, checked record. Torch-free, writes nothing.

    compose (Hydra) -> build_plan -> Plan(config, identity, run_name, run_dir, budget, checkpoints)

Every problem of the config is collected into one ConfigError. The plan's identity:

- config_sha256: canonical JSON of the whole resolved config,
- semantic_sha256: the same without the fields marked semantic=False in harness/schema.py
  (logging, paths, worker counts, placement, mode),
- data / model: spec digests now (cheap, torch-free); content digests are added when the data
  is prepared and the model built,
- code: git commit + digest of uncommitted changes; environment: package versions.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from arms import ARMS
from harness import identity as ident
from harness.checks import find_cached_snapshot, run_checks
from harness.errors import ConfigError, Problem
from harness.schema import Config, GrpoArm, Source, SyntheticData

PLAN_VERSION = 1
RUN_NAME_HASH_LEN = 8


@dataclass(frozen=True)
class Plan:
    config: dict  # the resolved config as JSON (enums as strings)
    choices: dict  # group -> option chosen at compose time
    identity: dict
    run_name: str
    run_dir: str
    budget: dict
    checkpoints: dict
    warnings: list = field(default_factory=list)

    @property
    def arm(self) -> str:
        return self.config["arm"]["name"]

    def to_json(self) -> dict:
        return {
            "plan_version": PLAN_VERSION,
            "run_name": self.run_name,
            "run_dir": self.run_dir,
            "identity": self.identity,
            "budget": self.budget,
            "checkpoints": self.checkpoints,
            "choices": self.choices,
            "warnings": self.warnings,
            "config": self.config,
        }


def build_plan(cfg: DictConfig | Config, choices: Mapping[str, Any] | None = None) -> Plan:
    typed = _to_typed(cfg)
    findings = run_checks(typed)
    if findings.problems:
        raise ConfigError(findings.problems)

    config = ident.to_jsonable(typed)
    non_semantic = ident.non_semantic_paths(typed)
    config_sha, semantic_sha = ident.config_hashes(config, non_semantic)
    run_name = make_run_name(typed, semantic_sha)
    run_dir = os.path.abspath(os.path.join(typed.output_root, "runs", run_name))
    identity = {
        "config_sha256": config_sha,
        "semantic_sha256": semantic_sha,
        "non_semantic_fields": non_semantic,
        "data": data_identity(typed),
        "model": model_identity(typed),
        "code": ident.code_identity(),
        "environment": ident.environment_identity(),
    }
    return Plan(
        config=config,
        choices={k: v for k, v in sorted((choices or {}).items()) if not k.startswith("hydra/")},
        identity=identity,
        run_name=run_name,
        run_dir=run_dir,
        budget=budget_summary(typed),
        checkpoints=checkpoint_schedule(typed),
        warnings=findings.warnings,
    )


def _to_typed(cfg: DictConfig | Config) -> Config:
    if isinstance(cfg, Config):
        return cfg
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError([
            Problem(key, "???", "is required and has no value", f"set it on the command line, e.g. {key}=...")
            for key in missing
        ])
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:  # e.g. an interpolation that does not resolve
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError([Problem(str(key), None, str(exc).splitlines()[0], "fix the value or the interpolation")]) from None
    if not isinstance(typed, Config):
        raise ConfigError([Problem("config", type(typed).__name__, "is not the harness schema", "compose conf/config.yaml")])
    return typed


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def make_run_name(cfg: Config, semantic_sha: str) -> str:
    """Deterministic: the same command finds the same run dir, and every rank agrees on it."""
    parts = (cfg.arm.name, cfg.model.name, cfg.data.name, f"s{cfg.seed}", semantic_sha[:RUN_NAME_HASH_LEN])
    return "-".join(_slug(p) for p in parts)


# --- identity placeholders filled by the data and model stages


def data_identity(cfg: Config) -> dict:
    d = cfg.data
    if isinstance(d, SyntheticData):
        spec = ident.to_jsonable(d, keep=ident.is_semantic)
        for k in ("name", "train_split", "eval_split", "eval_max_items"):  # how the set is used, not what it is
            spec.pop(k, None)
        spec["image_size"] = d.image_size or 4 * cfg.model.patch_size
        return {"kind": "synthetic", "spec": spec, "spec_sha256": ident.sha256_text(ident.canonical_json(spec)),
                "content_sha256": None}
    manifest = os.path.join(d.path or "", "manifest.json")
    return {"kind": "jsonl", "path": d.path,
            "manifest_sha256": ident.sha256_file(manifest) if os.path.isfile(manifest) else None,
            "content_sha256": None}


def model_identity(cfg: Config) -> dict:
    m = cfg.model
    if m.source is Source.tiny:
        spec = {"family": m.family.value, "patch_size": m.patch_size, "is_vlm": m.is_vlm,
                "tiny": ident.to_jsonable(m.tiny)}
        return {"kind": "tiny", "spec_sha256": ident.sha256_text(ident.canonical_json(spec)), "files_sha256": None}
    path = m.path or (str(find_cached_snapshot(m.hub_id)) if m.hub_id else None)
    cfg_json = os.path.join(path, "config.json") if path else None
    return {
        "kind": "pretrained",
        "hub_id": m.hub_id,
        "path": path,
        "revision": os.path.basename(path) if path and not m.path else None,
        "config_sha256": ident.sha256_file(cfg_json) if cfg_json and os.path.isfile(cfg_json) else None,
        "files_sha256": None,
    }


# --- budget and checkpoint schedule


def budget_summary(cfg: Config) -> dict:
    a, b = cfg.arm, cfg.budget
    if ARMS[a.name].rl:
        assert isinstance(a, GrpoArm)
        per_step = a.prompts_per_step * a.num_generations * a.max_completion_length
        return {
            "kind": "completion_tokens",
            "completion_token_ceiling": b.max_completion_tokens,
            "per_step_upper_bound": per_step,
            "completions_per_step": a.prompts_per_step * a.num_generations,
            "max_steps": b.max_steps,
            # steps that fit even if every completion runs to max_completion_length; shorter ones buy more
            "guaranteed_steps": min(b.max_steps, b.max_completion_tokens // per_step),
            "rule": "stop after the last step whose successor could exceed the remaining budget",
        }
    return {
        "kind": "loss_tokens",
        "loss_token_ceiling": b.max_loss_tokens,
        "max_steps": b.max_steps,
        "rule": "train on the longest prefix of one deterministic epoch whose loss tokens fit",
    }


def checkpoint_schedule(cfg: Config) -> dict:
    t, steps = cfg.train, cfg.budget.max_steps
    planned = list(range(t.save_steps, steps + 1, t.save_steps))
    return {
        "save_steps": t.save_steps,
        "keep_last": t.keep_last,
        "planned_steps": planned if len(planned) <= 50 else planned[:25] + ["..."] + planned[-5:],
        "permanent": ["final"],
        "note": "a run stopped early by its token budget saves a final checkpoint at its last step",
    }


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=False)
