"""Benchmark: frontier bind + rollback + verify on a ledger of 10^3 rows vs 10^6 rows.

    .venv/bin/python bench/frontier.py [--quick] [--reps 300] [--small 1000] [--large 1000000]
                                       [--save-steps 20] [--dir DIR]

Setup (not timed): one ledger per size (ledgers/rank-0.jsonl of its own run dir) written with AppendLog
itself, so the bytes and the chain are the harness's own: rows with the real ledger schema (HarnessReward:
completion_id <tag>:<step>:<slot>:<gen>, tokens, terminated, step, view), 32 per step (the default arm's
4 prompts x 8 generations), a frontier bound every --save-steps steps as CheckpointCallback would. The
schedule is counted back from the last row, so the last segment (the one a rollback verifies) has the same
size in both ledgers (--save-steps x 32 rows).

Timed, per repetition: bind a frontier at the last row (AppendLog.frontier(), fsync included), append one more
step of rows (flushed, as the reward does), reopen the log at the bound frontier (AppendLog(..., frontier):
check_frontier + truncate, what a resume does) and check_frontier again. Between repetitions (not timed) the
log is cut back to the previous frontier and the last segment appended again (the same bytes), so every
repetition binds the same frontier. The sizes alternate in one process. Prints per-size medians (total and per
phase) and last `ratio=<t(large)/t(small)>`; goal <= 1.5 (a frontier makes these O(last segment), not O(run)).
No torch here. Works in a temp folder (deleted afterwards) unless --dir is given.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness.accounting.logs import AppendLog, check_frontier, ledger_path

ROWS_PER_STEP = 32  # the default arm: prompts_per_step 4 x num_generations 8
PHASES = ("bind", "append", "rollback", "check")


def ledger_row(i: int, tag: str = "1a2b3c4d") -> dict:
    """Row i of a synthetic ledger, with HarnessReward's key set and value shapes."""
    step, j = divmod(i, ROWS_PER_STEP)
    slot, gen = divmod(j, 8)
    base = (step * 4 + slot) % 4096
    return {"completion_id": f"{tag}:{step}:{slot}:{gen}", "tokens": 4 + (i * 7) % 13, "terminated": i % 5 != 0,
            "step": step, "view": f"s{base:06d}:{('full', 'missing', 'control', 'substitute')[base % 4]}"}


class Ledger:
    """One size: its run dir, the frontier before the last segment, and the open log positioned at the last row."""

    def __init__(self, run_dir: Path, rows: int, segment: int):
        if rows <= segment:
            raise SystemExit(f"--small ({rows} rows) must exceed one segment ({segment} rows); lower --save-steps")
        self.run_dir, self.rows, self.segment = run_dir, rows, segment
        self.rel = ledger_path(0)
        t0 = time.perf_counter()
        log = AppendLog(run_dir, self.rel)
        start = rows % segment  # frontiers at rows - k * segment, k >= 0: the last segment is `segment` long
        for i in range(rows - segment):
            log.append(ledger_row(i))
            if (i + 1) % segment == start and i + 1 < rows - segment:
                log.frontier()
        self.prev = log.frontier()  # at rows - segment: the checkpoint before the last one
        log.close()
        self.log = None
        self.tail = [ledger_row(i) for i in range(rows - segment, rows)]  # the last segment, appended every rep
        self.step = [ledger_row(i) for i in range(rows, rows + ROWS_PER_STEP)]  # the step after the frontier
        self.reset()
        self.write_s = time.perf_counter() - t0
        self.size = (run_dir / self.rel).stat().st_size

    def reset(self) -> None:
        """Not timed: back to the previous frontier, the last segment appended again (same bytes, same chain)."""
        if self.log is not None:
            self.log.close()
        self.log = AppendLog(self.run_dir, self.rel, self.prev)
        for row in self.tail:
            self.log.append(row)
        self.log.flush()  # as the reward leaves it: written, not fsynced (the bind fsyncs the segment)

    def rep(self) -> dict:
        """One timed bind + append + rollback + verify; seconds per phase."""
        t0 = time.perf_counter()
        f = self.log.frontier()
        t1 = time.perf_counter()
        for row in self.step:
            self.log.append(row)
        self.log.flush()
        t2 = time.perf_counter()
        reopened = AppendLog(self.run_dir, self.rel, f)
        t3 = time.perf_counter()
        check_frontier(self.run_dir, f)
        t4 = time.perf_counter()
        if f.rows != self.rows or f.segment_start_rows != self.rows - self.segment:
            raise RuntimeError(f"frontier at {f.rows} rows (segment from {f.segment_start_rows}), expected "
                               f"{self.rows} ({self.rows - self.segment})")
        self.log.close()  # the writer that "crashed" after the frontier
        self.log = reopened
        return dict(zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)), total=t4 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (100) and warm-ups")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per size (default 300, --quick 100)")
    ap.add_argument("--small", type=int, default=1_000, help="rows of the small ledger")
    ap.add_argument("--large", type=int, default=1_000_000, help="rows of the large ledger")
    ap.add_argument("--save-steps", type=int, default=20, help="steps per checkpoint (frontier), 32 rows per step")
    ap.add_argument("--dir", default=None, help="where the run dirs go (default: a temp dir, deleted afterwards)")
    args = ap.parse_args()
    reps = args.reps or (100 if args.quick else 300)
    segment = args.save_steps * ROWS_PER_STEP

    with tempfile.TemporaryDirectory(prefix="bench-frontier-", dir=args.dir) as tmp:
        ledgers = {}
        for n in (args.small, args.large):
            ledgers[n] = lg = Ledger(Path(tmp) / f"run-{n}", n, segment)
            print(f"setup {n:>9} rows: {lg.size / 1e6:8.2f} MB written in {lg.write_s:6.2f} s "
                  f"(last segment {segment} rows, frontier every {args.save_steps} steps)", flush=True)
        times = {n: [] for n in ledgers}
        for i in range(reps + 5):  # alternate the sizes; the first 5 of each are warm-up
            for n, lg in ledgers.items():
                t = lg.rep()
                if i >= 5:
                    times[n].append(t)
                lg.reset()
        for lg in ledgers.values():
            lg.log.close()

    med = {n: {k: statistics.median(t[k] for t in ts) for k in (*PHASES, "total")} for n, ts in times.items()}
    print(f"\n{reps} timed repetitions per size, alternating; medians in ms")
    print(f"{'rows':>9} " + " ".join(f"{k:>9}" for k in (*PHASES, "total")))
    for n, m in med.items():
        print(f"{n:>9} " + " ".join(f"{m[k] * 1e3:9.3f}" for k in (*PHASES, "total")))
    small, large = med[args.small], med[args.large]
    print("per-phase ratio " + " ".join(f"{k} {large[k] / small[k]:.2f}" for k in PHASES))
    print(f"ratio={large['total'] / small['total']:.3f}")


if __name__ == "__main__":
    main()
