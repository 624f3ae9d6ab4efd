"""Every command line entry point exits quietly when the reader of its stdout goes away (`... | head -1`): exit 141
(128 + SIGPIPE), no traceback and no "Exception ignored" note (issue 39, item 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.entry import CLOSED_PIPE_EXIT
from tests.conftest import REPO


def _closed_reader(module: str, *args: str) -> subprocess.CompletedProcess:
    """Run `python -m module args` with a stdout pipe whose read end is closed before it writes anything: every
    write then fails with EPIPE (deterministic, unlike a real `| head`, which may read first)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


@pytest.mark.parametrize("module, args", [
    ("harness", ("mode=plan",)),
    ("harness", ("--help",)),  # Hydra's help
    ("harness.port", ("easyr1", "tests/fixtures/port/easyr1_grpo_papo.yaml", "--harness", "model=tiny_vlm",
                      "--harness", "data=synthetic")),
])
def test_a_closed_pipe_ends_every_command_quietly(module, args):
    proc = _closed_reader(module, *args)
    assert proc.returncode == CLOSED_PIPE_EXIT, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["harness.eval", "harness.verify", "harness.report", "harness.port", "harness.data"])
def test_every_entry_point_runs_through_the_wrapper(module):
    """argparse's own --help swallows the closed pipe (exit 0); every entry point's __main__ still runs its main
    through harness.entry.run_command, the one place that turns a closed pipe into a quiet 141."""
    proc = _closed_reader(module, "--help")
    assert proc.returncode in (0, CLOSED_PIPE_EXIT) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    main = REPO / module.replace(".", "/") / "__main__.py"
    assert "run_command(main)" in main.read_text()


def test_a_dataset_identity_piped_into_a_closed_reader(tmp_path):
    from harness.data.manifest import seal_dataset
    from tests.own_data import write_colour_set

    root = write_colour_set(tmp_path / "mine", n=4, n_test=1)
    seal_dataset(root, fill_digests=True)
    proc = _closed_reader("harness.data", "identity", str(root))
    assert proc.returncode == CLOSED_PIPE_EXIT and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_an_open_pipe_is_read_to_the_end():
    """The wrapper changes nothing for a reader that stays: the whole plan, exit 0."""
    import json

    proc = subprocess.run([sys.executable, "-m", "harness", "mode=plan"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["run_name"]
