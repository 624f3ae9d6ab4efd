"""Hydra's ConfigStore: the root schema, every group's schemas (arms from the registry), `--help` and the
named sweeps. The CLI calls `register` once, before Hydra composes. Torch-free."""

from __future__ import annotations

from harness.config.help import help_node
from harness.config.paths import SWEEPS_DIR
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


def register_sweeps(cs) -> None:
    """sweeps/<name>.yaml (named multiruns, package _global_) as the config group `sweep`: `-m sweep=<name>`."""
    from omegaconf import OmegaConf

    for path in sorted(SWEEPS_DIR.glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")
