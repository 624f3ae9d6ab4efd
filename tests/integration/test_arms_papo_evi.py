"""papo and evi_po end to end through the real CLI on the tiny VLM (`arm=<arm> debug=tiny`), no mocks.

Each starts from a copy of the session's debug=tiny warm start (tests/conftest.py), so no warm start is trained
here. papo also runs interrupted (SIGKILL after checkpoint 4) and resumed: the resumed run must sample and score
exactly what the straight run does, which needs the masks to be seeded by (seed, step, prompt) and not by a global
RNG. papo is in the default suite (~25 s); evi_po's straight run is a slow test (its resume: test_resume.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.verify import verify
from tests.conftest import PINNED, REPO, logged_values, run_harness

ENV = PINNED  # the same kernels in every run, so the resumed run can match bit for bit
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
def papo(tiny, tmp_path_factory) -> dict[str, Path]:
    """papo straight, and papo interrupted after checkpoint 4 and resumed by the same command."""
    out = tiny.case(tmp_path_factory.mktemp("papo") / "out")
    assert _killed_after_checkpoint(["arm=papo", f"output_root={out}", *tiny.ARGS, *tiny.cache], 4) == -signal.SIGKILL
    proc = tiny.run(out, "arm=papo", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "resuming from checkpoint-4" in proc.stderr
    straight = tiny.case(tmp_path_factory.mktemp("papo_straight") / "out")
    proc = tiny.run(straight, "arm=papo", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"papo": _run_dir(straight, "papo"), "resumed": _run_dir(out, "papo")}


@pytest.fixture(scope="module")
def evi_po(tiny, tmp_path_factory) -> dict[str, Path]:
    out = tiny.case(tmp_path_factory.mktemp("evi_po") / "out")
    proc = tiny.run(out, "arm=evi_po", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"evi_po": _run_dir(out, "evi_po")}


@pytest.fixture
def runs(request, arm):
    return request.getfixturevalue(arm)


ARMS = ["papo", pytest.param("evi_po", marks=pytest.mark.slow)]


@pytest.mark.parametrize("arm", ARMS)
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


@pytest.mark.parametrize("arm, keys", [("papo", PAPO_KEYS), pytest.param("evi_po", EVI_KEYS, marks=pytest.mark.slow)])
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


def test_resumed_papo_run_matches_the_straight_run(papo):
    straight, resumed = papo["papo"], papo["resumed"]
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
