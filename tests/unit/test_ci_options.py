"""The two pytest options .ci/run relies on (tests/conftest.py): --start-by skips, with its reason, every test whose
turn comes too late, and --run-first puts the named files first without reordering the rest."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import REPO

SMALL = "tests/unit/test_answers.py"
OTHER = "tests/unit/test_rewards.py"


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_start_by_in_the_past_skips_every_test_with_the_reason_and_in_the_future_skips_none():
    late = _pytest(SMALL, "--start-by", str(time.time() - 1))
    assert late.returncode == 0, late.stdout[-2000:]
    assert " passed" not in late.stdout and " skipped" in late.stdout, late.stdout[-2000:]
    assert "not started: CI's time for the slow tests had run out (--start-by)" in late.stdout
    in_time = _pytest(SMALL, "--start-by", str(time.time() + 3600))
    assert in_time.returncode == 0 and " passed" in in_time.stdout and "skipped" not in in_time.stdout, \
        in_time.stdout[-2000:]


def test_run_first_puts_the_named_file_first_and_keeps_the_rest_in_order():
    def order(*extra: str) -> list[str]:
        proc = _pytest("--collect-only", SMALL, OTHER, *extra)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return [line for line in proc.stdout.splitlines() if "::" in line]

    plain, first = order(), order("--run-first", OTHER)
    assert plain[0].startswith(SMALL)  # without the option, the command line's order
    assert first == [n for n in plain if n.startswith(OTHER)] + [n for n in plain if n.startswith(SMALL)]
