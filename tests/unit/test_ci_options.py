"""The pytest options of tests/conftest.py: --run-first (.ci/run) puts the named files first without reordering the
rest; --shuffle SEED runs the files, and the tests within each file, in an order drawn from the seed."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

SMALL = "tests/unit/test_answers.py"
OTHER = "tests/unit/test_rewards.py"


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_run_first_puts_the_named_file_first_and_keeps_the_rest_in_order():
    def order(*extra: str) -> list[str]:
        proc = _pytest("--collect-only", SMALL, OTHER, *extra)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return [line for line in proc.stdout.splitlines() if "::" in line]

    plain, first = order(), order("--run-first", OTHER)
    assert plain[0].startswith(SMALL)  # without the option, the command line's order
    assert first == [n for n in plain if n.startswith(OTHER)] + [n for n in plain if n.startswith(SMALL)]


def test_shuffle_draws_a_reproducible_order_by_file_and_changes_it_with_the_seed():
    def order(*extra: str) -> list[str]:
        proc = _pytest("--collect-only", SMALL, OTHER, *extra)
        assert proc.returncode == 0, proc.stdout[-2000:]
        return [line for line in proc.stdout.splitlines() if "::" in line]

    plain = order()
    drawn = {seed: order("--shuffle", str(seed)) for seed in range(4)}
    assert all(sorted(o) == sorted(plain) for o in drawn.values())  # the same tests, reordered
    assert order("--shuffle", "1") == drawn[1]  # the seed fixes the order
    assert len({tuple(o) for o in drawn.values()} | {tuple(plain)}) > 1
    for o in drawn.values():  # each file's tests stay together (a module fixture is built once)
        files = [n.split("::")[0] for n in o]
        assert sum(a != b for a, b in zip(files, files[1:])) == 1
