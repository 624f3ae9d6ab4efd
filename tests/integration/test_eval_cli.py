"""`python -m harness.eval` on a run whose dataset changed after training: refused with exit 4, the field named
(identity.data.content_sha256) and no eval artifact written or rewritten, whatever the arguments (a stored
result for the same settings included); on the unchanged dataset it evaluates (exit 0).

One tiny SFT run (4 steps) on a jsonl dataset is shared by the module; the test that changes the dataset
restores its bytes afterwards, so the tests do not depend on their order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.accounting.checkpoint import complete_checkpoints
from tests.conftest import run_harness

pytestmark = pytest.mark.slow  # ~30 s; the eval CLI on a training run: tests/integration/test_train_slice.py


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    from harness.data import write_synthetic

    tmp = tmp_path_factory.mktemp("evalcli")
    data = write_synthetic(tmp / "data", n_base=40, data_seed=3, image_size=56)
    proc = run_harness(f"output_root={tmp / 'out'}", "arm=sft", "debug=tiny", "data=jsonl", f"data.path={data}",
                       "data.eval_split=val", "budget.max_steps=4", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (run,) = (tmp / "out" / "runs").iterdir()
    assert (run / "eval" / "val.json").is_file()  # the training-time eval: a stored result the CLI could reuse
    return run, data


def _files(folder: Path) -> dict:
    """Every file under `folder` with its bytes and mtime: a rewrite with equal bytes still shows."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_on_the_unchanged_dataset_evaluates(sft_run):
    run, _ = sft_run
    ckpt = complete_checkpoints(run)[0].name  # checkpoint-2: not evaluated yet
    proc = run_harness(str(run), f"policy={ckpt}", "split=test", "max_items=all", module="harness.eval", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    art = json.loads((run / "eval" / f"test-{ckpt}.json").read_text())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert art["identity"]["data"]["content_sha256"] == manifest["identity"]["data"]["content_sha256"]
    assert art["label"] == ckpt and art["evaluated_by"]["command"] == "harness.eval"
    same = run_harness(str(run), module="harness.eval", timeout=120)  # the stored final-policy result
    assert same.returncode == 0 and "already evaluated" in same.stdout, same.stderr[-2000:]


def test_eval_on_a_changed_dataset_is_refused_with_exit_4_and_writes_nothing(sft_run):
    from harness.data import seal_dataset

    run, data = sft_run
    manifest = json.loads((run / "run_manifest.json").read_text())
    trained_on = manifest["identity"]["data"]["content_sha256"]
    originals = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    try:
        rec = data / "records" / "train.jsonl"  # a split the eval does not even read: the identity still differs
        lines = rec.read_text().splitlines()
        row = json.loads(lines[0])
        row["question"] = row["question"].replace("What", "Which")
        rec.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")
        seal_dataset(data, fill_digests=True)  # a valid dataset again, with another content digest
        before = _files(run)
        # the stored result for these settings / the same, forced / a split and a policy not evaluated yet
        for args in ([], ["--force"], ["split=test"], [f"policy={complete_checkpoints(run)[0].name}", "split=val"]):
            proc = run_harness(str(run), *args, module="harness.eval", timeout=300)
            assert proc.returncode == 4, (args, proc.returncode, proc.stdout[-1000:], proc.stderr[-3000:])
            assert "identity.data.content_sha256" in proc.stderr and trained_on in proc.stderr, proc.stderr
            assert "fix:" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert "already evaluated" not in proc.stdout  # no stored result reported for other data
            assert _files(run) == before, args  # no eval artifact (nor anything else in the run) written
    finally:
        for p in data.rglob("*"):
            if p.is_file() and p not in originals:
                p.unlink()
        for p, content in originals.items():
            p.write_bytes(content)
    assert json.loads((data / "manifest.json").read_text())["sha256"] == trained_on  # restored for the module
