"""Plan: a composed config turned into a frozen, hashed, checked record. Torch-free, writes nothing.

    compose (Hydra) -> build_plan -> Plan(config, identity, run_name, run_dir, budget, checkpoints, parent)

The arm's kind (its registry entry: sft | rl) is resolved here once and travels with the plan
(`Plan.kind`, an object of harness.kinds that is also its name): it decides the budget, the stages a run goes
through and what it records. The run path reads the typed config, `Plan.cfg` (harness.config.typed). An RL
arm with arm.init=sft carries its parent: the plan of its SFT warm start, composed once with the
child from the same command line (`arm=sft`, `budget.max_steps=budget.sft_warm_start_steps`),
shown by `mode=plan` and run first by the lifecycle. An arm with a planned teacher (opd's
arm.teacher=grpo) carries it the same way: `Plan.teacher`, the plan of that arm's run of the same command
line (same model, data, budget, seed: the very run a sweep `arm=grpo,opd` makes), run before this one; its
final policy's digest enters this plan's identity.teacher as soon as it exists. Ranks of a multi-process job
read all of them from the driver's plan file; they never compose.

Every problem of the config is collected into one ConfigError. The plan's identity:

- config_sha256: canonical JSON of the whole resolved config,
- semantic_sha256: the same without the fields marked semantic=False in harness/config/schema.py
  (logging, paths, worker counts, placement, mode),
- data / model: spec digests now (cheap, torch-free); content digests are added when the data
  is prepared and the model built,
- code: git commit + digest of uncommitted changes; environment: package versions.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from arms import registry
from harness import identity as ident
from harness import kinds
from harness.config.checks import checkpoint_path, run_checks
from harness.config.fields import DERIVED, TEACHER, WARM_START
from harness.config.schema import Config, Source, SyntheticData
from harness.config.store import TEACHER_SUFFIX, WARM_START_SUFFIX
from harness.data.spec import split_rows, synthetic_args
from harness.errors import ConfigError, Problem
from harness.rounds import GenerationRound

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
    kind: kinds.Kind  # the arm's kind (arms registry) as its object (harness.kinds); it is also its name, sft | rl
    warnings: list = field(default_factory=list)
    overrides: list = field(default_factory=list)  # the command line's overrides (not part of identity)
    parent: "Plan | None" = None  # the SFT warm start of an RL arm with arm.init=sft, run first
    teacher: "Plan | None" = None  # a planned teacher (opd's arm.teacher=<arm>), run after the parent, before this

    @property
    def arm(self) -> str:
        return self.cfg.arm.name

    @functools.cached_property
    def cfg(self) -> Config:
        """The typed config (the schema's dataclasses, the arm's own class), rebuilt from `config` once per plan
        object: what the run path reads (`plan.cfg.train.eval_steps`); `config` stays the serialized form."""
        from harness.config.typed import from_json

        return from_json(Config, self.config)

    @functools.cached_property
    def round(self) -> GenerationRound | None:
        """The generation round of an arm that samples (None for sft): the one the run's ranks, trainers, ledger and
        smoke check use (plan time builds it from the typed config: budget_summary, the arm's check_round)."""
        return self.kind.round(self.cfg)

    @property
    def checkpoint_dir(self) -> str | None:
        """The pretrained checkpoint's directory the plan resolved (identity.model.path); None for a tiny model."""
        return self.identity["model"].get("path")

    @property
    def prerequisites(self) -> tuple["Prerequisite", ...]:
        """The plans this one needs run first, in the order the lifecycle runs them: the SFT warm start (role
        WARM_START, the `parent`), then a planned teacher (role TEACHER); each derived from this plan's command line
        by the schema's `derived=` flags (`inherited`)."""
        return tuple(Prerequisite(role, p) for role, p in ((WARM_START, self.parent), (TEACHER, self.teacher))
                     if p is not None)

    def to_json(self) -> dict:
        return {
            "plan_version": PLAN_VERSION,
            "run_name": self.run_name,
            "run_dir": self.run_dir,
            "kind": self.kind,
            "identity": self.identity,
            "budget": self.budget,
            "checkpoints": self.checkpoints,
            "choices": self.choices,
            "warnings": self.warnings,
            "overrides": self.overrides,
            "parent": self.parent.to_json() if self.parent else None,
            "teacher": self.teacher.to_json() if self.teacher else None,
            "config": self.config,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        """The plan a driver wrote (harness.launch): exactly what was printed and checked, parent included."""
        return cls(config=d["config"], choices=d["choices"], identity=d["identity"], run_name=d["run_name"],
                   run_dir=d["run_dir"], budget=d["budget"], checkpoints=d["checkpoints"], kind=kinds.of(d["kind"]),
                   warnings=d.get("warnings", []), overrides=d.get("overrides", []),
                   parent=cls.from_json(d["parent"]) if d.get("parent") else None,
                   teacher=cls.from_json(d["teacher"]) if d.get("teacher") else None)


@dataclass(frozen=True)
class Prerequisite:
    """A plan a run needs completed first, and its role (harness.config.fields.WARM_START | TEACHER)."""

    role: str
    plan: Plan

    @property
    def what(self) -> str:
        return {WARM_START: "the SFT warm start", TEACHER: "the teacher"}[self.role]


def compose_plan(argv: list[str]) -> "Plan":
    """The Plan of a command line (its SFT parent included), composed once."""
    from harness.config.compose import compose

    cfg, choices = compose(argv)
    return build_plan(cfg, choices, argv)


def build_plan(cfg: DictConfig | Config, choices: Mapping[str, Any] | None = None,
               overrides: list[str] | None = None, *, process_identity: dict | None = None) -> Plan:
    """The checked plan of a composed config. `overrides` are the command line it was composed from: an RL
    arm with arm.init=sft derives its parent (the SFT warm start) from them; without them (a config built
    in code) the plan has no parent, and the lifecycle refuses to train it with arm.init=sft.
    `process_identity`: the code and environment identity already read for this plan's child (the parent
    is planned in the same process, a moment later: the same git state and packages)."""
    typed = _to_typed(cfg)
    kind = registry()[typed.arm.name].kind
    findings = run_checks(typed)
    if findings.problems:
        raise ConfigError(findings.problems)

    config = ident.to_jsonable(typed)
    non_semantic = ident.non_semantic_paths(typed) + kind.irrelevant_fields()
    config_sha, semantic_sha = ident.config_hashes(config, non_semantic)
    model_identity = planned_model_identity(typed)
    data_identity = planned_data_identity(typed)
    identity = {
        "config_sha256": config_sha,
        "semantic_sha256": semantic_sha,
        "non_semantic_fields": non_semantic,
        "data": data_identity,
        "model": model_identity,
        **kind.identity(config),  # RL: the reward functions' sources (SFT samples nothing, scores nothing)
        **typed.arm.extra_identity(typed),  # e.g. opd's teacher
        **(process_identity or {"code": ident.code_identity(), "environment": ident.environment_identity()}),
    }
    # named after the identity: the reward's digest in the name is the very one a resume compares (read once)
    run_name = make_run_name(typed, semantic_sha, model_identity.get("files_sha256"),
                             data_identity.get("content_sha256"), identity.get("reward"))
    run_dir = os.path.abspath(os.path.join(typed.output_root, "runs", run_name))
    shared = {k: identity[k] for k in ("code", "environment")}
    parent = sft_parent(typed, overrides, shared) if overrides is not None else None
    teacher = teacher_plan(typed, overrides, shared) if overrides is not None else None
    if teacher is not None:
        identity = {**identity, "teacher": planned_teacher_identity(typed.arm.teacher, teacher)}
    return Plan(
        kind=kind,
        parent=parent,
        teacher=teacher,
        config=config,
        choices={k: v for k, v in sorted((choices or {}).items()) if not k.startswith("hydra/")},
        identity=identity,
        run_name=run_name,
        run_dir=run_dir,
        budget=kind.budget_summary(typed),
        checkpoints=checkpoint_schedule(typed),
        warnings=findings.warnings,
        overrides=list(overrides or []),
    )


def sft_parent(cfg: Config, overrides: list[str], process_identity: dict | None = None) -> Plan | None:
    """The plan of the SFT warm start of an RL plan with arm.init=sft: the same command line (model, data,
    seed, ...) with arm=sft and the default rollout (SFT samples nothing: a preset's or a sweep's rollout is the RL
    run's), capped by budget.sft_warm_start_steps; None for every other plan."""
    if not registry()[cfg.arm.name].kind.warm_start(cfg):
        return None
    b = cfg.budget
    length = [f"arm.max_length={b.sft_warm_start_max_length}"] if b.sft_warm_start_max_length is not None else []

    def derived(steps: int, epochs: int | None) -> Plan:
        passes = [] if epochs == 1 else [f"arm.epochs={'null' if epochs is None else epochs}"]  # 1: sft.yaml's
        return _derived_plan(overrides, _not_for_warm_start, WARM_START_SUFFIX,
                             ["arm=sft", "rollout=hf", *passes, f"budget.max_steps={steps}", f"train.save_steps={steps}", *length],
                             process_identity, whose="the SFT warm start of this run (arm.init=sft)", arm="sft",
                             other="or set arm.init=scratch or a policy path")

    rows = split_rows(cfg.data, cfg.data.train_split, cfg.model.patch_size)
    if b.sft_warm_start_epochs is None:  # sized in steps, over as many passes as they need
        one_pass = derived(b.sft_warm_start_steps, 1)
        if rows is not None and b.sft_warm_start_steps * one_pass.cfg.arm.batch_size <= rows:
            return one_pass  # one pass holds every step: the warm start it always was (its identity unchanged)
        return derived(b.sft_warm_start_steps, None)
    if not rows:
        raise ConfigError([Problem("budget.sft_warm_start_epochs", b.sft_warm_start_epochs,
                                   f"the rows of the training split {cfg.data.train_split!r} cannot be read before the "
                                   "run (no manifest.json listing records/<split>.jsonl)",
                                   "seal the dataset first (python -m harness.data manifest DIR), or size the warm "
                                   "start in steps (budget.sft_warm_start_steps)")])
    batch = derived(1, b.sft_warm_start_epochs).cfg.arm.batch_size  # conf/arm/sft.yaml's, as composed
    return derived(-(-b.sft_warm_start_epochs * rows // batch), b.sft_warm_start_epochs)


def teacher_plan(cfg: Config, overrides: list[str], process_identity: dict | None = None) -> Plan | None:
    """The plan of a planned teacher (opd's arm.teacher=grpo): the same command line with arm=<that arm> and
    without the student's arm.* knobs, so it is the run a sweep over arms makes of it; None for every other plan."""
    name = cfg.arm.teacher_arm()
    if name is None:
        return None
    return _derived_plan(overrides, _not_for_teacher, TEACHER_SUFFIX, [f"arm={name}"], process_identity,
                         whose=f"the teacher of this run (arm.teacher={name})", arm=name,
                         other="or set arm.teacher=run:<run_name> or a policy directory")


def planned_teacher_identity(spec: str, teacher: Plan) -> dict:
    """identity.teacher of a plan with a planned teacher: its run's final policy (digest and eval when it has
    completed; None until then, filled by the lifecycle once it has run) and its plan's semantic identity."""
    from harness.accounting.weights import final_policy_identity

    out = {"spec": spec, **final_policy_identity(teacher.run_dir)}
    out.update(arm=teacher.arm, semantic_sha256=teacher.identity["semantic_sha256"])  # the plan's, whatever is on disk
    return out


def _derived_plan(overrides: list[str], dropped, suffix: str, extra: list[str], process_identity: dict | None, *,
                  whose: str, arm: str, other: str) -> Plan:
    """The plan of the child's command line without the keys `dropped(key)` names, plus `extra`."""
    from harness.config.compose import compose

    keep = [_derived_experiment(o, dropped, suffix) for o in overrides if not dropped(o.lstrip("+~").split("=", 1)[0])]
    argv = [*keep, *extra]
    try:
        return build_plan(*compose(argv), argv, process_identity=process_identity)
    except ConfigError as exc:  # say whose problem it is: the command line is the child's
        where = lambda p: (f" in conf/arm/{arm}.yaml (its arm.* come from there, not from this command "  # noqa: E731
                           "line)") if p.field.startswith("arm.") else ""
        raise ConfigError([Problem(p.field, p.value, f"in {whose}: {p.why}", f"{p.fix}{where(p)}; {other}")
                           for p in exc.problems]) from None


def inherited(key: str, role: str) -> bool:
    """Whether the run derived as `role` (WARM_START, TEACHER) takes this key of its child's command line (or
    experiment preset): what the schema field on its path says (`derived=` of harness.config.fields.f; a group's
    field decides for every key under it). A key the schema does not know (hydra.*, a group option such as
    debug=tiny, a key of one data option only) is taken: the compose of the derived run judges it."""
    import typing

    cls: Any = Config
    for seg in key.lstrip("+~").split("."):
        fld = next((x for x in dataclasses.fields(cls) if x.name == seg), None) if dataclasses.is_dataclass(cls) else None
        if fld is None:
            return True
        if role not in fld.metadata.get("derived", DERIVED):
            return False
        tp = typing.get_type_hints(cls)[seg]
        tp = next((t for t in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(t)), None)
        if tp is None:
            return True
        cls = tp
    return True


def _not_for_warm_start(key: str) -> bool:
    """Whether the SFT warm start leaves out this key of its child's command line: the arm and its knobs, the
    rollout (SFT samples nothing), the step caps and checkpoint cadence (its own), and what acts on this run only
    (a pause, a push, the mode): the schema's `derived` flags (inherited)."""
    return not inherited(key, WARM_START)


def _not_for_teacher(key: str) -> bool:
    """Whether a planned teacher leaves out this key of its student's command line: the student's arm and knobs,
    and what acts on this run only (pausing it, pushing it). The budget, step caps, rollout, model, data, seed and
    train.* stay: the teacher is the run `arm=<teacher>` makes of the same line."""
    return not inherited(key, TEACHER)


def _derived_experiment(override: str, dropped, suffix: str) -> str:
    """experiment=<name> -> its variant without the dropped keys (harness.config.store.warm_start_experiment)."""
    key, sep, value = override.partition("=")
    if key.lstrip("+") != "experiment" or not sep:
        return override
    from harness.config.store import warm_start_experiment

    option = warm_start_experiment(value, dropped, suffix)
    return f"{key}={option}" if option else override


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


def make_run_name(cfg: Config, semantic_sha: str, model_files_sha: str | None = None,
                  data_content_sha: str | None = None, reward_identity: Mapping[str, Any] | None = None) -> str:
    """Deterministic: the same command finds the same run dir, and every rank agrees on it. A real checkpoint and
    a dataset of your own (data=jsonl) add their content digest: another checkpoint, or another or edited dataset
    at the same data.path, is another run (not a resume conflict); the synthetic set's spec is in the config.
    A reward of your own adds `<function>_<code digest>` after the data (identity.reward, harness.rewards.functions
    .run_name_part): the inputs the run learns from, each with its version, then the seed and the config hash; an
    edited reward file is another run. The built-in reward adds nothing, and neither does an arm without a reward
    (SFT, so a warm start serves every reward)."""
    from harness.rewards.identity import run_name_part

    lora = [cfg.model.tuning.value] if cfg.model.tuning.value != "full" else []  # a LoRA run says so in its name
    model = cfg.model.name
    if cfg.model.source is Source.pretrained and model_files_sha:  # another checkpoint is another run, not a resume
        model = f"{model}_{model_files_sha[:RUN_NAME_HASH_LEN]}"
    data = cfg.data.name
    if not isinstance(cfg.data, SyntheticData) and data_content_sha:
        data = f"{data}_{data_content_sha[:RUN_NAME_HASH_LEN]}"
    reward = run_name_part(reward_identity, RUN_NAME_HASH_LEN)
    parts = (cfg.arm.name, model, *lora, data, *([reward] if reward else []), f"s{cfg.seed}",
             semantic_sha[:RUN_NAME_HASH_LEN])
    return "-".join(_slug(p) for p in parts)


# --- identity placeholders filled by the data and model stages


def planned_data_identity(cfg: Config) -> dict:
    """Spec identity now (cheap, torch-free); the content digest when the dataset is already on disk."""
    from harness.data import data_identity as read_identity
    from harness.data.spec import synthetic_dir, synthetic_spec, synthetic_spec_sha256

    d = cfg.data
    if isinstance(d, SyntheticData):
        args = synthetic_args(d, cfg.model.patch_size)
        root = synthetic_dir(d.cache_dir, **args)
        content = read_identity(root)["sha256"] if (root / "manifest.json").is_file() else None
        return {"kind": "synthetic", "spec": synthetic_spec(**args), "spec_sha256": synthetic_spec_sha256(**args),
                "content_sha256": content}
    manifest = os.path.join(d.path or "", "manifest.json")
    return {"kind": "jsonl", "path": d.path,
            "content_sha256": read_identity(d.path)["sha256"] if os.path.isfile(manifest) else None}


def planned_model_identity(cfg: Config) -> dict:
    m = cfg.model
    if m.source is Source.tiny:
        spec = {"family": m.family.value, "patch_size": m.patch_size, "is_vlm": m.is_vlm,
                "tiny": ident.to_jsonable(m.tiny)}
        return {"kind": "tiny", "spec_sha256": ident.sha256_text(ident.canonical_json(spec)), "files_sha256": None}
    from harness.models.pretrained import checkpoint_identity, read_checkpoint

    path = checkpoint_path(m)  # run_checks refused a missing or unloadable one
    found = checkpoint_identity(path)
    info, _ = read_checkpoint(path)
    return {
        "kind": "pretrained",
        "hub_id": m.hub_id if not m.path else None,  # model.path wins: the hub id then names nothing loaded
        "path": path,
        "revision": os.path.basename(path) if not m.path else None,
        "config_sha256": found["files"].get("config.json", {}).get("sha256"),
        "model_type": info.model_type,
        "files_sha256": found["files_sha256"],
        "files": found["files"],
    }


# --- budget and checkpoint schedule


def checkpoint_schedule(cfg: Config) -> dict:
    t, steps = cfg.train, cfg.budget.max_steps
    planned = list(range(t.save_steps, steps + 1, t.save_steps))
    return {
        "save_steps": t.save_steps,
        "keep_last": t.keep_last,
        "planned_steps": planned if len(planned) <= 50 else planned[:25] + ["..."] + planned[-5:],
        "permanent": ["final"],
        "note": "a run stopped early by its token budget saves a final checkpoint at its last step",
        **({"kept_for_eval": f"every {t.eval_steps} steps (train.eval_steps: a periodic eval scores each)"}
           if t.eval_steps else {}),
    }


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=False)
