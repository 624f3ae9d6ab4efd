"""papo and evi_po end to end through the real CLI on the tiny VLM (`arm=<arm> debug=tiny`), no mocks.

One output root is shared, so the SFT warm start runs once. papo also runs interrupted (SIGKILL after
checkpoint 4) and resumed: the resumed run must sample and score exactly what the straight run does,
which needs the masks to be seeded by (seed, step, prompt) and not by a global RNG.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import REPO, logged_values, run_harness

pytestmark = pytest.mark.slow  # the module fixture kills, resumes and reruns papo and evi_po: ~125 s
ENV = {"OMP_NUM_THREADS": "1"}  # the same kernels in every run, so the resumed run can match bit for bit
PAPO_KEYS = ("loss/kl_prcp", "loss/papo", "papo/entropy_orig", "papo/entropy_masked", "papo/kl_clip_ratio",
             "clip_ratio/high_mean")
EVI_KEYS = ("loss/direction", "evi/FULL/accuracy", "evi/FULL/abstain", "evi/MISSING/abstain",
            "evi/CONTROL/accuracy", "evi/SUBSTITUTE/accuracy", "evi/FULL/dir_acc", "loss/evidence",
            "evi/FULL/kl_miss", "evi/FULL/kl_ctrl")


def _run_dir(out: Path, arm: str) -> Path:
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


def _killed_after_checkpoint(args: list[str], step: int) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **ENV})
    try:
        for line in proc.stderr:
            if f"checkpoint {step} published" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=300)
    return proc.returncode


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("arms")
    args = ["arm=papo", "debug=tiny", f"output_root={out}"]
    # papo, interrupted after checkpoint 4 and resumed by the same command; then moved aside
    assert _killed_after_checkpoint(args, 4) == -signal.SIGKILL
    proc = run_harness(*args, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resuming from checkpoint-4" in proc.stderr
    first = _run_dir(out, "papo")
    resumed = out / "resumed" / first.name  # the run dir's name is its identity: keep it
    resumed.parent.mkdir()
    shutil.move(str(first), resumed)
    # the straight runs
    result = {"out": out, "resumed": resumed}
    for arm in ("papo", "evi_po"):
        proc = run_harness(f"arm={arm}", "debug=tiny", f"output_root={out}", timeout=300, env=ENV)
        assert proc.returncode == 0, proc.stderr[-4000:]
        result[arm] = _run_dir(out, arm)
    return result


@pytest.mark.parametrize("arm", ["papo", "evi_po"])
def test_run_completes_with_consistent_accounting(runs, arm):
    run = runs[arm]
    assert verify(run) == []
    proc = run_harness(str(run), module="harness.verify", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    comp = json.loads((run / "completion.json").read_text())
    assert comp["status"] == "completed" and comp["arm"] == arm
    ledger = list(read_rows(run / "ledgers/rank-0.jsonl"))
    assert sum(r["tokens"] for r in ledger) == comp["realized_completion_tokens"] <= comp["completion_token_ceiling"]
    assert len(ledger) == comp["optimizer_steps"] * 32
    ev = json.loads((run / "eval" / "test.json").read_text())
    assert set(ev["per_relation"]) == {"FULL", "CONTROL", "MISSING", "SUBSTITUTE"}


@pytest.mark.parametrize("arm, keys", [("papo", PAPO_KEYS), ("evi_po", EVI_KEYS)])
def test_arm_metrics_are_logged(runs, arm, keys):
    rows = list(read_rows(runs[arm] / "metrics.jsonl"))
    comp = json.loads((runs[arm] / "completion.json").read_text())
    assert [r["step"] for r in rows] == list(range(1, comp["optimizer_steps"] + 1))
    seen = set().union(*rows)
    assert not [k for k in keys if k not in seen]
    if arm == "papo":  # the masked image moves the policy: the perception KL is logged and not identically 0
        assert all("loss/kl_prcp" in r for r in rows) and max(r["loss/kl_prcp"] for r in rows) > 0
    else:  # the arm's own grading of each step's rollouts agrees with the reward trace, relation by relation
        trace = list(read_rows(runs[arm] / "traces/rank-0.jsonl"))
        checked = 0
        for r in rows:
            for rel in ("FULL", "CONTROL", "MISSING", "SUBSTITUTE"):
                graded = [t["correct"] for t in trace if t["step"] == r["step"] - 1 and t["relation"] == rel]
                if graded:
                    assert r[f"evi/{rel}/accuracy"] == pytest.approx(sum(graded) / len(graded)), (r["step"], rel)
                    checked += 1
        assert checked >= len(rows)


def test_resumed_papo_run_matches_the_straight_run(runs):
    straight, resumed = runs["papo"], runs["resumed"]
    assert verify(resumed) == []
    ids = lambda run: [(r["completion_id"], r["tokens"]) for r in read_rows(run / "ledgers/rank-0.jsonl")]  # noqa: E731
    assert ids(resumed) == ids(straight)  # the same samples, step by step
    # bit for bit: every logged value but the timings, and the final weights (a rel=1e-5 match would let a
    # resumed run drift, e.g. from a mask drawn off another RNG state, as long as it drifted slowly)
    assert logged_values(resumed) == logged_values(straight)
    assert {"loss/kl_prcp", "papo/entropy_masked"} <= set(logged_values(resumed)[-1])
    assert (resumed / "final_policy/model.safetensors").read_bytes() == \
        (straight / "final_policy/model.safetensors").read_bytes()
    audit = json.loads((resumed / "audits/resume-1-rank-0.json").read_text())
    assert audit["status"] == "passed" and audit["checkpoint"] == "checkpoint-4"
