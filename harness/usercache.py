"""The user's harness cache: $HARNESS_CACHE_DIR, else $XDG_CACHE_HOME/harness, else ~/.cache/harness. It holds what
is kept across runs and output roots, each in its own folder: the compose cache (harness.config.compose_cache,
compose/) and the file digests of pretrained checkpoints (harness.models.pretrained, digests/). No imports."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir() -> Path | None:
    """The cache's root; None when no home directory can be found (then nothing is cached)."""
    root = os.environ.get("HARNESS_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and is ignored
        return Path(xdg) / "harness"
    try:
        return Path.home() / ".cache" / "harness"
    except RuntimeError:  # no HOME and no passwd entry
        return None
