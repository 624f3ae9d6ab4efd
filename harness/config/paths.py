"""Where the configuration lives in the repository (one derivation, from harness.identity.REPO_ROOT)."""

from harness.identity import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf"  # Hydra's config groups
SWEEPS_DIR = REPO_ROOT / "sweeps"  # named multiruns, the config group `sweep`
ARMS_DIR = REPO_ROOT / "arms"  # the arm registry: each arm's config schema (arms/<name>/config.py)

__all__ = ["ARMS_DIR", "CONF_DIR", "REPO_ROOT", "SWEEPS_DIR"]
