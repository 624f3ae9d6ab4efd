"""Accounting: append-only JSONL logs (ledger, reward trace, metrics) and their frontiers.

A frontier binds a log's position to a checkpoint: byte offset, row count and a chained digest.
The digest chains segments (sha256(previous chain + bytes appended since the previous
frontier)), so binding a frontier costs nothing extra and verifying one before a rollback reads
only the last segment: O(1) in the length of the run, never a copy of the file.

    ledgers/rank-<r>.jsonl   one row per sampled completion: completion_id, tokens, terminated, step
    traces/rank-<r>.jsonl    one row per scored completion: completion_id, reward, components, ...
    metrics.jsonl            one row per logged step (rank 0)

Torch-free: verify and report read these files too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness import faults
from harness.rundir import naming

GENESIS = "0" * 64  # chain value of an empty log


@dataclass(frozen=True)
class Frontier:
    path: str  # relative to the run dir
    offset: int  # bytes
    rows: int
    chain_sha256: str  # sha256(prev chain + segment bytes), hex
    segment_start: int  # offset of the previous frontier
    segment_start_rows: int
    prev_chain_sha256: str

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: dict) -> "Frontier":
        return Frontier(**d)


class FrontierError(RuntimeError):
    """A log does not match the frontier recorded in a checkpoint (tampered, truncated or foreign)."""


class AppendLog:
    """An append-only JSONL file whose position can be bound to a checkpoint and rolled back to it."""

    def __init__(self, run_dir: str | os.PathLike, rel_path: str, frontier: Frontier | None = None):
        self.run_dir = Path(run_dir)
        self.rel_path = rel_path
        self.path = self.run_dir / rel_path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if frontier is None:
            _truncate(self.path, 0)
            self.offset, self.rows, chain = 0, 0, GENESIS
        else:
            rollback(self.run_dir, frontier)
            self.offset, self.rows, chain = frontier.offset, frontier.rows, frontier.chain_sha256
        self._start_segment(chain)
        self._fh = open(self.path, "ab")

    def _start_segment(self, chain: str) -> None:
        self.chain = chain
        self.segment_start, self.segment_start_rows = self.offset, self.rows
        self._hasher = hashlib.sha256(bytes.fromhex(chain))

    def append(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode("utf-8")
        try:
            if faults.armed():
                self._fh.write(data[: len(data) // 2])
                faults.point(f"append:{self.rel_path}")  # tests only: a crash or a full disk mid-row
                self._fh.write(data[len(data) // 2:])
            else:
                self._fh.write(data)
        except OSError as exc:
            raise naming(exc, self.path) from exc
        self._hasher.update(data)
        self.offset += len(data)
        self.rows += 1

    def flush(self, fsync: bool = False) -> None:
        try:
            self._fh.flush()
            if fsync:
                os.fsync(self._fh.fileno())
        except OSError as exc:  # buffered rows meet a full disk here
            raise naming(exc, self.path) from exc

    def frontier(self) -> Frontier:
        """Bind the current position (durably) and start a new segment."""
        self.flush(fsync=True)
        chain = self._hasher.hexdigest()
        f = Frontier(self.rel_path, self.offset, self.rows, chain, self.segment_start, self.segment_start_rows, self.chain)
        self._start_segment(chain)
        return f

    def close(self) -> None:
        if not self._fh.closed:
            self.flush(fsync=True)
            self._fh.close()


def _truncate(path: Path, offset: int) -> None:
    with open(path, "ab") as fh:
        fh.truncate(offset)
        fh.flush()
        os.fsync(fh.fileno())


def check_frontier(run_dir: str | os.PathLike, f: Frontier) -> None:
    """Raise FrontierError unless the log's last segment up to f.offset hashes to f.chain_sha256."""
    path = Path(run_dir) / f.path
    if not path.exists():
        raise FrontierError(f"{f.path}: missing, but the checkpoint's frontier expects {f.rows} rows ({f.offset} bytes)")
    size = path.stat().st_size
    if size < f.offset:
        raise FrontierError(f"{f.path}: {size} bytes, shorter than the checkpoint's frontier at {f.offset} bytes")
    with open(path, "rb") as fh:
        fh.seek(f.segment_start)
        segment = fh.read(f.offset - f.segment_start)
    h = hashlib.sha256(bytes.fromhex(f.prev_chain_sha256))
    h.update(segment)
    if h.hexdigest() != f.chain_sha256:
        raise FrontierError(f"{f.path}: bytes {f.segment_start}..{f.offset} do not match the checkpoint's frontier digest")
    rows = f.segment_start_rows + segment.count(b"\n")
    if rows != f.rows or (segment and not segment.endswith(b"\n")):
        raise FrontierError(f"{f.path}: {rows} rows at the frontier, the checkpoint recorded {f.rows}")


def rollback(run_dir: str | os.PathLike, f: Frontier) -> int:
    """Cut a log back to exactly a checkpoint's frontier; returns the number of bytes dropped."""
    check_frontier(run_dir, f)
    path = Path(run_dir) / f.path
    dropped = path.stat().st_size - f.offset
    _truncate(path, f.offset)
    return dropped


def read_rows(path: str | os.PathLike) -> Iterator[dict]:
    """Rows of a JSONL log (a torn last line, from a crash mid-append, is not a row)."""
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n"):
                yield json.loads(line)


def ledger_path(rank: int) -> str:
    return f"ledgers/rank-{rank}.jsonl"


def trace_path(rank: int) -> str:
    return f"traces/rank-{rank}.jsonl"


METRICS_PATH = "metrics.jsonl"


def ledger_summary(run_dir: Path, ranks: int = 1) -> dict:
    """What completion.json reports of the ledgers and traces of `ranks` ranks (and verify recounts)."""
    tokens = count = truncated = 0
    groups = set()
    for r in range(ranks):
        p = Path(run_dir) / ledger_path(r)
        for row in read_rows(p) if p.exists() else ():
            tokens += row["tokens"]
            count += 1
            truncated += not row["terminated"]
            _, step, slot, _ = row["completion_id"].rsplit(":", 3)
            groups.add((step, slot))
    malformed = 0
    for r in range(ranks):
        p = Path(run_dir) / trace_path(r)
        for row in read_rows(p) if p.exists() else ():
            malformed += row["parser_error"] not in (None, "truncated")
    return {"realized_completion_tokens": tokens, "realized_completion_count": count,
            "unique_prompt_groups": len(groups), "truncated_completions": truncated,
            "malformed_completions": malformed}
