"""Append-only logs and their frontiers: bind, roll back exactly, refuse tampered or short logs."""

from __future__ import annotations

import pytest

from harness.accounting.logs import AppendLog, FrontierError, check_frontier, read_rows, rollback


def rows(n, start=0):
    return [{"completion_id": f"c{i}", "tokens": i % 7 + 1} for i in range(start, start + n)]


def test_rollback_cuts_exactly_to_the_frontier(tmp_path):
    log = AppendLog(tmp_path, "ledgers/rank-0.jsonl")
    for r in rows(5):
        log.append(r)
    f1 = log.frontier()
    for r in rows(3, 5):
        log.append(r)
    f2 = log.frontier()
    for r in rows(4, 8):  # sampled after the last checkpoint: must be regenerated, not kept
        log.append(r)
    log.close()
    assert f1.rows == 5 and f2.rows == 8 and f2.prev_chain_sha256 == f1.chain_sha256
    dropped = rollback(tmp_path, f2)
    assert dropped > 0
    assert [r["completion_id"] for r in read_rows(log.path)] == [f"c{i}" for i in range(8)]
    # reopening at the frontier continues the chain: a later frontier still verifies
    log2 = AppendLog(tmp_path, "ledgers/rank-0.jsonl", f2)
    log2.append({"completion_id": "c8-again", "tokens": 2})
    f3 = log2.frontier()
    log2.close()
    check_frontier(tmp_path, f3)
    assert f3.rows == 9


def test_tampered_segment_is_refused(tmp_path):
    log = AppendLog(tmp_path, "t.jsonl")
    for r in rows(4):
        log.append(r)
    f = log.frontier()
    log.close()
    data = log.path.read_bytes().replace(b'"tokens":2', b'"tokens":3', 1)
    log.path.write_bytes(data)
    with pytest.raises(FrontierError, match="do not match"):
        rollback(tmp_path, f)


def test_short_or_missing_log_is_refused(tmp_path):
    log = AppendLog(tmp_path, "t.jsonl")
    for r in rows(4):
        log.append(r)
    f = log.frontier()
    log.close()
    log.path.write_bytes(log.path.read_bytes()[:-5])
    with pytest.raises(FrontierError, match="shorter"):
        check_frontier(tmp_path, f)
    log.path.unlink()
    with pytest.raises(FrontierError, match="missing"):
        check_frontier(tmp_path, f)


def test_frontier_verification_reads_only_the_last_segment(tmp_path, monkeypatch):
    log = AppendLog(tmp_path, "t.jsonl")
    for r in rows(1000):
        log.append(r)
    log.frontier()
    for r in rows(3, 1000):
        log.append(r)
    f = log.frontier()
    log.close()
    read = []
    real_open = open

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

        def seek(self, n):
            return self.fh.seek(n)

        def read(self, n=-1):
            data = self.fh.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr("builtins.open", lambda p, m="r", *a, **k: Spy(real_open(p, m, *a, **k)) if m == "rb" else real_open(p, m, *a, **k))
    check_frontier(tmp_path, f)
    assert sum(read) == f.offset - f.segment_start < f.offset / 100


def test_fresh_log_truncates_a_stale_file(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"a":1}\n')
    log = AppendLog(tmp_path, "t.jsonl")
    log.close()
    assert log.path.read_bytes() == b""


def test_torn_last_line_is_not_a_row(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"a":1}\n{"a":')
    assert list(read_rows(p)) == [{"a": 1}]
