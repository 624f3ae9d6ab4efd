"""Compose a config from a command line with Hydra's compose API, strictly (the house error form). Torch-free.

`hydra.main` composes every config twice (once to read hydra.mode); a single run, the SFT warm start
derived from a plan (harness.plan.sft_parent) and a sweep job's run dir are composed once here. Outside a Hydra
app the result is cached on disk (harness/config/compose_cache.py: exact, keyed by every conf and schema file,
the versions and the argv), so planning a command again skips Hydra.
"""

from __future__ import annotations

from pathlib import Path

from harness.config.paths import ARMS_DIR, CONF_DIR as _CONF

CONF_DIR = str(_CONF)  # Hydra wants a string
_CONFIG_CODE_DIR = Path(__file__).resolve().parent  # harness/config: the schemas, the ConfigStore, the checks


def ensure_registered() -> None:
    """The schemas in Hydra's ConfigStore, once per process, before Hydra composes (harness.cli registers them
    itself before hydra.main, with --help's text when asked for; a cached compose needs none of it)."""
    from hydra.core.config_store import ConfigStore

    if "base_config.yaml" not in ConfigStore.instance().repo:
        from harness.config.store import register

        register(with_help=False)


def compose(argv: list[str]):
    """(config without the hydra node, group choices) composed once with Hydra's compose API.

    Strict: a compose error of Hydra or OmegaConf, and an override key the schema lacks (`+`/`++` included),
    raise a ConfigError in the house form (harness/config/overrides.py). Cached outside a Hydra app: inside one
    (a multirun job) the search path is the app's, which the key does not cover.
    """
    from hydra.core.global_hydra import GlobalHydra

    from harness.config import compose_cache

    if GlobalHydra.instance().is_initialized() or not compose_cache.enabled():
        return _compose(argv)
    key = _cache_key(argv)
    hit = compose_cache.load(key)
    if hit is not None:
        return hit  # stored only after the strict check passed for this very argv and config tree
    cfg, choices = _compose(argv)  # a ConfigError propagates: errors are never stored
    compose_cache.store(key, cfg, choices)
    return cfg, choices


def _cache_key(argv: list[str]) -> str:
    from harness.config import compose_cache, store

    # read at call time: what Hydra composes from (CONF_DIR) and what register() stores (store.SWEEPS_DIR)
    return compose_cache.compose_key(list(argv), Path(CONF_DIR), Path(store.SWEEPS_DIR),
                                     {"harness/config": _CONFIG_CODE_DIR, "arms": ARMS_DIR})


def _compose(argv: list[str]):
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
