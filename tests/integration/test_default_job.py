"""The README's default job (`./run.sh` = `python -m harness`): its GRPO run's greedy accuracy on the held-out
split (>= 300 views) improves by at least 0.05 over its SFT init, for seeds 0, 1 and 2. Not by abstaining: the
abstention rate on FULL views stays low. With a thread per core, as a user runs it (the one test that unsets
tests/conftest.py's OMP_NUM_THREADS=1): on one thread here, seeds 1 and 2 ended below their init (0.667 -> 0.617,
0.596 -> 0.581; seed 0 0.526 -> 0.762), so that is not the README's job. At two threads, a training on the other
pytest worker slows it ~3x: .ci/run runs this file alone. The wall time is printed, never asserted: a machine like
CI's can be twice as slow as a developer's (the default job took 189 s on one, 80 s on another); speed goals are
ratios printed by bench/ scripts."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_harness


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_job_learns(tmp_path_factory, seed):
    out = tmp_path_factory.mktemp(f"default-s{seed}")
    t0 = time.perf_counter()
    proc = run_harness(f"seed={seed}", f"output_root={out}", timeout=600, env={"OMP_NUM_THREADS": None})
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = [p for p in (out / "runs").iterdir() if p.name.startswith("grpo-")]
    comp = json.loads((run / "completion.json").read_text())
    before, after = comp["eval_before"], comp["eval_after"]
    print(f"seed {seed}: {wall:.1f} s, accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f} "
          f"on {after['n']} views; FULL abstains {after['per_relation']['FULL']['abstention_rate']:.2f}")
    assert after["n"] >= 300
    assert after["accuracy"] >= before["accuracy"] + 0.05
    assert after["per_relation"]["FULL"]["abstention_rate"] < 0.2
