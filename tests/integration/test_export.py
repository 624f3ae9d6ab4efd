"""`python -m harness.export`: a finished run's record sent to a logger after the fact (issue 39, item 6), and the
"already complete" message that names it when a finished run's command is repeated with a logger."""

from __future__ import annotations

import json
import sqlite3

import pytest

from harness.accounting.logs import read_rows
from tests.conftest import run_dir_of, run_harness


def test_a_finished_run_is_exported_to_tensorboard_and_trackio(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tiny.copy(tmp_path / "out")
    run = run_dir_of(out, "grpo")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = run_harness(str(run), "--to", "tensorboard", module="harness.export", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in read_rows(run / "metrics.jsonl") if "reward" in r]
    completion = json.loads((run / "completion.json").read_text())
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward")] == [r["step"] for r in rows]
    assert [e.value for e in acc.Scalars("train/reward")] == pytest.approx([r["reward"] for r in rows], rel=1e-6)
    (after,) = acc.Scalars("eval/accuracy_after")
    assert round(after.value, 6) == round(completion["eval_after"]["accuracy"], 6)
    assert after.step == completion["optimizer_steps"]
    # the run itself is not touched, and a second export refuses to mix its events with the first's
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    again = run_harness(str(run), "--to", "tensorboard", module="harness.export", timeout=300)
    assert again.returncode == 2 and "--force" in again.stderr

    # a folder of runs (the output_root: the warm start too) into trackio, under <output_root>/trackio
    proc = run_harness(str(out), "--to", "trackio", module="harness.export", timeout=300, env={"TRACKIO_DIR": None})
    assert proc.returncode == 0, proc.stderr[-2000:]
    db = sqlite3.connect(out / "trackio" / "harness.db")
    counts = dict(db.execute("select run_name, count(*) from metrics group by run_name").fetchall())
    sft = run_dir_of(out, "sft")
    assert counts == {run.name: len(list(read_rows(run / "metrics.jsonl"))) + 1,
                      sft.name: len(list(read_rows(sft / "metrics.jsonl"))) + 1}


def test_an_unfinished_run_is_refused(tmp_path):
    run = tmp_path / "runs" / "grpo-x"
    run.mkdir(parents=True)
    (run / "run_manifest.json").write_text(json.dumps({"status": "interrupted"}))
    proc = run_harness(str(run), "--to", "tensorboard", module="harness.export")
    assert proc.returncode == 2 and "interrupted, not completed" in proc.stderr and "Traceback" not in proc.stderr


def test_a_logger_on_a_finished_run_names_the_export(tiny, tmp_path):
    out = tiny.copy(tmp_path / "out")
    proc = tiny.run(out, "logger=tensorboard")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is already complete; nothing to do" in proc.stderr
    assert "logger=tensorboard: loggers are not part of a run's identity" in proc.stderr
    assert f"python -m harness.export {run_dir_of(out, 'grpo')} --to tensorboard" in proc.stderr
