"""Where the configuration lives in the repository (one derivation, from harness.identity.REPO_ROOT)."""

from harness.identity import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf"  # Hydra's config groups
SWEEPS_DIR = REPO_ROOT / "sweeps"  # named multiruns, the config group `sweep`

__all__ = ["CONF_DIR", "REPO_ROOT", "SWEEPS_DIR"]
