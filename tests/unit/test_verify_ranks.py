"""`python -m harness.verify` checks every rank's ledger, not only rank 0's: a completed two-rank run dir, made
without training (the harness's callbacks and logs driven by tests/unit/trainer_sim.py, completion.json written as
finalize writes its accounting), verifies clean; a copy in which only rank 1's ledger was changed fails, naming
rank 1's ledger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import rundir
from harness.accounting.checkpoint import complete_checkpoints
from harness.accounting.logs import ledger_summary, read_rows
from harness.identity import sha256_file
from harness.verify import main as verify_main
from harness.verify import verify
from tests.unit.trainer_sim import Ranks, train

LEDGER0, LEDGER1, TRACE1 = "ledgers/rank-0.jsonl", "ledgers/rank-1.jsonl", "traces/rank-1.jsonl"


def tokens(rank: int, step: int, j: int) -> int:
    """Uneven ranks, rows of different lengths; rank 1's first row has 3 tokens (one digit)."""
    return (3 * rank + step + j) % 17


@pytest.fixture
def run(plan_of, tmp_path, monkeypatch) -> Path:
    """A completed GRPO run of two ranks, 6 steps, a checkpoint every 2, keep_last=1: checkpoint-2 was removed,
    checkpoint-4 and the final checkpoint-6 are retained (their frontiers bind steps 3-4 and 5-6 of every log)."""
    plan = plan_of("arm=grpo", "placement=ddp", "placement.num_processes=2")
    claimed = rundir.claim(plan)
    claimed.set_status("running")
    runs = train(plan, claimed.path, Ranks(2, monkeypatch), tokens, save_steps=2, keep_last=1, max_steps=6)
    assert [r.steps for r in runs] == [6, 6]
    path = claimed.path
    fp = path / "final_policy"
    fp.mkdir()
    (fp / "model.safetensors").write_bytes(b"final weights")
    rundir.atomic_write_json(fp / "harness_policy.json", {
        "files": {"model.safetensors": {"sha256": sha256_file(fp / "model.safetensors")}}, "card": "final"})
    comp = {"status": "completed", "run_name": plan.run_name, "arm": "grpo", "kind": "rl",
            "identity": claimed.manifest["identity"], "optimizer_steps": 6, "stopped_by": "max_steps",
            "checkpoints": [p.name for p in complete_checkpoints(path)], "world_size": 2,
            **ledger_summary(path, 2), "completion_token_ceiling": plan.budget["completion_token_ceiling"],
            "ranks": [{"rank": r.ctx.rank, "completion_tokens": r.ctx.tokens_used, "completions": r.ctx.completions}
                      for r in runs]}
    rundir.atomic_write_json(path / rundir.COMPLETION, comp)
    claimed.set_status("completed")
    claimed.release()
    assert comp["checkpoints"] == ["checkpoint-4", "checkpoint-6"]
    assert comp["realized_completion_count"] == 2 * 6 * 16 and comp["ranks"][0] != comp["ranks"][1]
    return path


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "copy" / "runs" / run.name))


def lines(run: Path, rel: str) -> list[bytes]:
    return (run / rel).read_bytes().splitlines(keepends=True)


def write_lines(run: Path, rel: str, rows: list[bytes]) -> None:
    (run / rel).write_bytes(b"".join(rows))


def tokens_of(run: Path, rel: str) -> int:
    return sum(r["tokens"] for r in read_rows(run / rel))


def frontier(run: Path, rel: str) -> dict:
    m = json.loads((complete_checkpoints(run)[-1] / "harness_checkpoint.json").read_text())
    (f,) = [f for logs in m["frontier"].values() for f in logs.values() if f["path"] == rel]
    return f


def test_a_consistent_two_rank_run_verifies_clean(run, capsys):
    assert verify(run) == []
    assert verify_main([str(run)]) == 0 and "ok:" in capsys.readouterr().out


def test_a_changed_token_count_in_rank_1s_first_row_is_named_by_its_rank(run, tmp_path, capsys):
    """The first row is before every retained checkpoint's segment: only the token sums can see the change; the
    per-rank sum says which ledger (the total alone would not)."""
    copy = copy_of(run, tmp_path)
    total, mine = tokens_of(copy, LEDGER0) + tokens_of(copy, LEDGER1), tokens_of(copy, LEDGER1)
    rows = lines(copy, LEDGER1)
    assert b'"tokens":3,' in rows[0]
    rows[0] = rows[0].replace(b'"tokens":3,', b'"tokens":4,')  # the same length: every frontier still holds
    write_lines(copy, LEDGER1, rows)
    assert verify(copy) == [f"ledger tokens sum to {total + 1}, completion.json says {total}",
                            f"{LEDGER1} sums to {mine + 1} tokens, rank 1 counted {mine}"]
    assert verify_main([str(copy)]) == 1
    assert f"{LEDGER1} sums to {mine + 1} tokens, rank 1 counted {mine}" in capsys.readouterr().err


def test_a_changed_token_count_in_rank_1s_last_row_breaks_the_final_frontier(run, tmp_path):
    copy = copy_of(run, tmp_path)
    total, mine = tokens_of(copy, LEDGER0) + tokens_of(copy, LEDGER1), tokens_of(copy, LEDGER1)
    f = frontier(copy, LEDGER1)
    rows = lines(copy, LEDGER1)
    t = json.loads(rows[-1])["tokens"]
    new = t + 1 if len(str(t + 1)) == len(str(t)) else t - 1
    rows[-1] = rows[-1].replace(b'"tokens":%d,' % t, b'"tokens":%d,' % new)
    write_lines(copy, LEDGER1, rows)
    got = verify(copy)
    d = new - t
    assert got[:2] == [f"ledger tokens sum to {total + d}, completion.json says {total}",
                       f"{LEDGER1} sums to {mine + d} tokens, rank 1 counted {mine}"]
    assert len(got) == 3 and got[2].startswith(
        f"{LEDGER1}: bytes {f['segment_start']}..{f['offset']} do not match checkpoint-6's frontier digest")


def test_a_row_removed_from_rank_1s_ledger_is_named_by_its_rank(run, tmp_path):
    copy = copy_of(run, tmp_path)
    rows = lines(copy, LEDGER1)
    n0, mine = len(lines(copy, LEDGER0)), tokens_of(copy, LEDGER1)
    total = tokens_of(copy, LEDGER0) + mine
    gone = json.loads(rows[-1])["tokens"]
    write_lines(copy, LEDGER1, rows[:-1])
    got = verify(copy)
    n = n0 + len(rows)
    assert got[:5] == [f"ledger tokens sum to {total - gone}, completion.json says {total}",
                       f"ledger has {n - 1} rows, completion.json says {n}",
                       f"trace rows ({n}) do not match ledger rows ({n - 1}) one to one",
                       f"{LEDGER1} sums to {mine - gone} tokens, rank 1 counted {mine}",
                       f"{LEDGER1}: {sum(map(len, rows[:-1]))} bytes, shorter than checkpoint-6's frontier at "
                       f"{frontier(copy, LEDGER1)['offset']} bytes (edited after it was bound?); fix: restore the "
                       f"original {LEDGER1}, or rerun the job into a new output_root"]
    assert len(got) == 5 and not any(LEDGER0 in v for v in got)


def test_rank_1s_ledger_missing_is_named(run, tmp_path):
    copy = copy_of(run, tmp_path)
    mine = tokens_of(copy, LEDGER1)
    (copy / LEDGER1).unlink()
    (copy / TRACE1).unlink()
    got = "\n".join(verify(copy))
    assert f"{LEDGER1} sums to 0 tokens, rank 1 counted {mine}" in got
    assert "1 rank ledger(s) for world size 2" in got
    assert f"{LEDGER1}: missing, but checkpoint-6's frontier expects" in got
