"""tests/forkserver.py: a run forked from the preloaded interpreter is the run a fresh `python -m` makes (its
output, its exit status: a code, a message, a traceback, a signal; its argv, cwd, sys.path, environment, atexit
functions and non-daemon threads), a timeout kills it, and a run whose environment the preloaded packages would
read otherwise is not sent there."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, _run_env
from tests.forkserver import Server

PROBE = "tests.fixtures.forkprobe"


@pytest.fixture(scope="module")
def server():
    s = Server(_run_env(None))
    yield s
    s.stop()


@pytest.mark.parametrize("case", ["exit0", "exit3", "exit_text", "raise", "sigkill", "sigterm", "thread"])
def test_a_forked_run_is_a_fresh_run(server, case):
    env = _run_env({"HARNESS_PROBE": case})
    fresh = subprocess.run([sys.executable, "-m", PROBE, case, "x y"], cwd=REPO, env=env, capture_output=True,
                           text=True, stdin=subprocess.DEVNULL, timeout=60)
    forked = server.run(PROBE, [case, "x y"], REPO, env, 60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert f'"probe": "{case}"' in forked.stdout and '"main": "__main__"' in forked.stdout


def test_a_timeout_kills_the_run(server, tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(PROBE, ["sleep"], REPO, _run_env({"HARNESS_PROBE_PID": str(pid_file)}), 3)
    pid = int(pid_file.read_text())
    for _ in range(600):  # the probe sleeps an hour: gone means killed (its monitor reaps it)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the timed-out run {pid} still runs")
    assert server.run(PROBE, ["exit3"], REPO, _run_env(None), 60).returncode == 3  # and the server serves on


def test_only_variables_read_at_run_time_may_differ(server):
    env = _run_env(None)
    assert server.accepts(env) and server.accepts({**env, "HARNESS_FAULT": "rl.step@3:kill"})
    assert not server.accepts({**env, "OMP_NUM_THREADS": "2"})
    assert not server.accepts({**env, "HF_HUB_OFFLINE": "1", "HF_HOME": "/elsewhere"})
    assert not server.accepts({k: v for k, v in env.items() if k != "OMP_NUM_THREADS"})
    # trackio reads TRACKIO_DIR as it imports, and the preloaded TRL imported it: the harness could not set it first
    assert not server.accepts(env, ["/out", "--to", "trackio"]) and not server.accepts(env, ["logger=trackio"])
    assert server.accepts(env, ["/out", "--to", "tensorboard"])


def test_run_harness_forks_in_every_test():
    """The server's environment is the pytest process's at its start; pytest's own variables (PYTEST_CURRENT_TEST
    names each test) change after it, and must not send every later run to a fresh interpreter."""
    from tests.conftest import _fork_server

    assert _fork_server(_run_env({"PYTEST_CURRENT_TEST": "another test (call)"})) is not None
    assert _fork_server(_run_env({"OMP_NUM_THREADS": None})) is None
