"""Compose a config from a command line with Hydra's compose API, strictly (the house error form). Torch-free.

`hydra.main` composes every config twice (once to read hydra.mode); a single run, the SFT warm start
derived from a plan (harness.plan.sft_parent) and a sweep job's run dir are composed once here.
"""

from __future__ import annotations

from harness.config.paths import CONF_DIR as _CONF

CONF_DIR = str(_CONF)  # Hydra wants a string


def ensure_registered() -> None:
    """The schemas in Hydra's ConfigStore (the CLI registers them at import, with or without --help)."""
    from hydra.core.config_store import ConfigStore

    if "base_config.yaml" not in ConfigStore.instance().repo:
        from harness.config.store import register

        register(with_help=False)


def compose(argv: list[str]):
    """(config without the hydra node, group choices) composed once with Hydra's compose API.

    Strict: a compose error of Hydra or OmegaConf, and an override key the schema lacks (`+`/`++` included),
    raise a ConfigError in the house form (harness/config/overrides.py).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from harness.config.overrides import explain_compose_error, strict_check

    ensure_registered()
    try:
        if GlobalHydra.instance().is_initialized():  # inside a Hydra app (e.g. a multirun job): same search path
            cfg = hydra_compose(config_name="config", overrides=argv, return_hydra_config=True)
        else:
            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3", job_name="harness"):
                cfg = hydra_compose(config_name="config", overrides=argv, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:  # ValueError: e.g. group=null
        raise explain_compose_error(exc, argv) from None
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    strict_check(cfg, argv)
    return cfg, choices
