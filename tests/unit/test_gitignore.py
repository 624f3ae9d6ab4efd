"""What the repository's .gitignore keeps out of a run's code identity (harness.identity.code_identity: `dirty`)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("venv", ["folder", "symlink"])
def test_a_venv_folder_or_symlink_leaves_the_checkout_clean(tmp_path, venv):
    """`.venv` as a symlink to a shared environment made every run `dirty: true`: `.venv/` matches folders only."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True, check=True).stdout  # noqa: E731
    git("init", "-q")
    git("add", ".gitignore")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "ignore")
    env = tmp_path / "shared-env" if venv == "symlink" else repo / ".venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    if venv == "symlink":
        os.symlink(env, repo / ".venv")
    assert git("status", "--porcelain", "--untracked-files=all") == ""
