"""Hydra's ConfigStore: the root schema, every group's schemas (arms from the registry), `--help` and the
named sweeps, and the SFT warm-start variants of experiment presets. The CLI calls `register` once, before Hydra
composes. Torch-free."""

from __future__ import annotations

from harness.config.help import help_node
from harness.config.paths import CONF_DIR, SWEEPS_DIR
from harness.config.schema import SCHEMAS, Config


def register(with_help: bool = True) -> None:
    """Store the root schema and every group schema in Hydra's ConfigStore (idempotent).

    The generated --help text costs ~10 ms, so the CLI builds it only when --help is asked for.
    """
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
    cs.store(group="hydra/help", name="harness", node=help_node() if with_help else {"template": ""})
    register_sweeps(cs)
    from harness.slurm import register_resolvers

    register_resolvers()  # conf/hydra/launcher/slurm*.yaml size the job from the placement


def register_sweeps(cs) -> None:
    """sweeps/<name>.yaml (named multiruns, package _global_) as the config group `sweep`: `-m sweep=<name>`."""
    from omegaconf import OmegaConf

    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


WARM_START_SUFFIX = "__sft_warm_start"
TEACHER_SUFFIX = "__teacher"
DERIVED_SUFFIXES = (WARM_START_SUFFIX, TEACHER_SUFFIX)  # stored variants, not options a user names


def is_derived_option(option: str) -> bool:
    return any(s in option for s in DERIVED_SUFFIXES)


def warm_start_experiment(name: str, dropped, suffix: str = WARM_START_SUFFIX) -> str | None:
    """The option of the config group `experiment` that an RL run's SFT warm start composes with, for the child's
    `experiment=<name>`: conf/experiment/<name>.yaml without what the warm start does not take from the child's
    command line either (`dropped(key)` says which: the arm and its knobs, the rollout, the step caps, ...),
    stored as `<name>__sft_warm_start` (package _global_). The rest (model, data, budget, seed, train.*) keeps
    its place in the defaults list, so debug=tiny and the command line take precedence over it exactly as they
    do in the child. None when there is no such file (the compose names the unknown option)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    path = CONF_DIR / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return None
    node = OmegaConf.to_container(OmegaConf.load(path))
    node.pop("hydra", None)  # its sweeper params say what a multirun varies, not what a warm start is

    def keep(entry) -> bool:  # `- override /arm: evi_po` is the child's arm
        if not isinstance(entry, dict):
            return True
        return not any(k.startswith("override") and dropped(k.split(None, 1)[-1].strip("/")) for k in entry)

    def prune(tree: dict, prefix: str) -> dict:
        out = {}
        for k, v in tree.items():
            key = f"{prefix}{k}"
            if dropped(key):
                continue
            out[k] = prune(v, key + ".") if isinstance(v, dict) else v
        return {k: v for k, v in out.items() if v != {} or tree[k] == {}}

    defaults = [e for e in node.pop("defaults", []) if keep(e)]
    pruned = prune(node, "")
    if defaults:
        pruned = {"defaults": defaults, **pruned}
    option = name + suffix  # the SFT warm start's, or (TEACHER_SUFFIX) a planned teacher's: opd's arm.teacher=grpo
    ConfigStore.instance().store(group="experiment", name=option, node=OmegaConf.create(pruned), package="_global_")
    return option
