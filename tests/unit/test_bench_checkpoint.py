"""bench/checkpoint.py (issue 47's figures) runs every step of both sides: the harness's checkpoint (save, state
digests, publish, retention) and resume (the deep check's thread, find, the loads, the resume audit), and the bare
Trainer's. On a two-layer model with a small hidden size, one counted round; the page cache is not dropped (the
cold resume is left out: it would drop the whole machine's cache). The seconds mean nothing here and are not
asserted; what is asserted is that each side ran and the harness's resume audit passed (harness_resume asserts
it), so the bench cannot silently fall behind the code it measures."""

from __future__ import annotations

import importlib.util
import math

from tests.conftest import REPO


def _bench_checkpoint():
    spec = importlib.util.spec_from_file_location("bench_checkpoint", REPO / "bench" / "checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_checkpoint_bench_runs_both_sides_of_every_work(tmp_path, capsys):
    b = _bench_checkpoint()
    works = ("checkpoint", "resume", "loads")
    ratios = b.bench_size("test", 1, tmp_path, works=works)
    assert set(ratios) == set(works)
    assert all(math.isfinite(r) and r > 0 for r in ratios.values()), ratios
    out = capsys.readouterr().out
    assert "round 1:" in out and "harness resume breakdown" in out and "audit" in out
    assert not (tmp_path / "run-test").exists()  # the bench cleans up after itself
