"""examples/: each example's commands, as its README gives them, on a fresh output_root."""

from __future__ import annotations

import json

import pytest

from tests.conftest import PINNED, REPO, run_dir_of, run_harness


@pytest.mark.slow
def test_count_dots_trains_with_its_numeric_tolerance_reward(tmp_path):
    """make_data.py -> harness.data init -> grpo at debug=tiny with examples/count_dots/reward.py (a file outside the
    package, named relative to the repository root): the run completes, its trace is that reward's, and eval scores
    with it."""
    import subprocess
    import sys

    src, data, out = tmp_path / "src", tmp_path / "data", tmp_path / "out"
    made = subprocess.run([sys.executable, "examples/count_dots/make_data.py", str(src)], cwd=REPO,
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    init = run_harness("init", str(data), "--from", str(src / "table.csv"), "--answer-type", "number",
                       module="harness.data")
    assert init.returncode == 0, init.stderr
    assert "next: python -m harness data=jsonl data.path=" in init.stdout
    proc = run_harness("data=jsonl", f"data.path={data}", "debug=tiny", f"output_root={out}",
                       "reward._target_=examples/count_dots/reward.py:within_tolerance", "+reward.kwargs.tolerance=0",
                       "+reward.kwargs.format_bonus=0.1", timeout=600, env=PINNED)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = run_dir_of(out, "grpo")
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["identity"]["reward"]["functions"]["main"]["file"] == str(REPO / "examples/count_dots/reward.py")
    trace = [json.loads(line) for line in (run / "traces/rank-0.jsonl").read_text().splitlines()]
    # the reward's own values: 0 (no answer), 0.1 (a wrong count, well-formed), 1.1 (the right count)
    assert {t["reward"] for t in trace} <= {0.0, 0.1, 1.1}
    assert all(set(t["components"]) == {"within_tolerance"} for t in trace)
    for t in trace:  # a well-formed answer that parses as the target's number is exactly the full reward
        if t["parser_error"] is None and t["prediction"] == t["gold"]:
            assert t["reward"] == 1.1
    ev = json.loads((run / "eval/test.json").read_text())
    preds = [json.loads(line) for line in (run / "eval/test.predictions.jsonl").read_text().splitlines()]
    assert ev["accuracy"] == sum(p["reward"] >= 1.0 for p in preds) / len(preds)
    assert ev["mean_reward"] == pytest.approx(sum(p["reward"] for p in preds) / len(preds))
