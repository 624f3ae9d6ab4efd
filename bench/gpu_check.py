"""The project's GPU check (issue 34): every arm on CUDA, the hub-layout fixtures, processor parity, and a
Qwen2.5-VL-3B-shaped model at realistic lengths, in one command, under 8 minutes on one H200.

    scripts/gpu_check.sh [--cpu] [--out DIR] [--work DIR] [--deadline S] [--steps N] [--full-steps N] [--keep-work]
    python bench/gpu_check.py ...          (the same, with the Python and PYTHONPATH already set up)

Parts, each a list of steps; each step is a child process with its own timeout (and the check's --deadline),
so one hang costs only its own part; a failed step is recorded with the tail of its log and the check goes on:
  env           torch / CUDA / library versions, free disk (on CUDA: a visible GPU, or nothing else runs)
  arms_tiny     sft, grpo, papo, evi_po, opd at debug=tiny on the tiny default model (one multirun), each run dir
                verified; run_mode=smoke once
  arms_fixture  the three tiny hub-layout fixtures built (harness.models.snapshot); every arm on the qwen2_5_vl one
                (model=qwen model.path=FIX, LoRA), plus grpo with model.tuning=full; every run dir verified
  parity        harness.models.parity on the three fixtures (needs torchvision: there on GPU nodes)
  qwen3b        a Qwen2.5-VL-3B-shaped checkpoint built on the GPU (timed), then grpo and papo with LoRA and with
                full bf16 from it (arm.init=scratch, one 448x448 image per prompt, 4 prompts x 8 generations x
                256 tokens, eval off, only the final checkpoint) and a bare TRL GRPOTrainer on the LoRA grpo plan
                (bench/gpu_check_child.py): s/step, sampled tokens/s, peak GPU memory, one checkpoint save,
                harness / bare step ratio
On CUDA, env runs first, then four lanes side by side (bench/gpu_check_parts.plan_steps: the tiny runs are bound by
per-token launch overhead, not by the GPU), while the two 3B trial processes import ahead; then the 3B trials
alone, one after the other, so their timings see an idle GPU.

--cpu is the dry run of the same shape on a CPU machine: placement.device=cpu, float32, shorter debug budgets, a
tiny fixture instead of the 3B shape, short completions and small images, parity skipped without torchvision.

Writes into --out (default $OUT, else outputs/gpu_check): gpu_check.json (every figure, rewritten after each
step, so a check cut short still leaves what it measured), logs/<step>.log, and a summary on stdout (the shell
wrapper tees stdout into gpu_check.log). Runs, caches and checkpoints go to --work (default: a temp dir, removed
at the end unless --keep-work), never into --out. Exit 0 when every part passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check_parts as parts  # noqa: E402
from gpu_check_parts import Step  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 480  # issue 34: the whole check in under 8 minutes on one H200
TAIL_LINES = 40


class Check:
    """Runs the steps, streams their output, keeps the report and rewrites gpu_check.json after every step."""

    def __init__(self, out: Path, mode: str, deadline_s: float | None, meta: dict):
        self.out, self.mode, self.t0 = out, mode, time.monotonic()
        self.deadline = self.t0 + deadline_s if deadline_s else None
        self.lock = threading.Lock()
        self.steps: dict[str, dict] = {}
        self.planned: dict[str, str] = {}  # step name -> part, of every step plan() was given
        self.done: dict[str, threading.Event] = {}  # one per planned step: set when it has finished
        self.live: set[subprocess.Popen] = set()  # the children running now (abort() stops them)
        self.started: dict[str, dict] = {}  # prestart()ed children waiting for their turn
        self.stopping = False
        self.threads: list[threading.Thread] = []  # the lanes running side by side
        self.not_run: str | None = None  # why the steps not run were not (finish() records them)
        self.report = {"check": "gpu_check", "version": 1, "mode": mode, "budget_s": BUDGET_S, **meta,
                       "started_at": _now(), "parts": {p: {"status": "pending", "steps": {}, "figures": {}}
                                                       for p in parts.PARTS}}
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.write()

    def plan(self, steps: list[Step]) -> None:
        self.planned = {s.name: s.part for s in steps}
        self.done = {s.name: threading.Event() for s in steps}

    def _wait_for(self, needs: tuple[str, ...]) -> None:
        """Until every planned step in `needs` has finished (another lane may still run it), or the deadline."""
        for n in needs:
            if n in self.done:
                left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
                self.done[n].wait(timeout=left)

    def say(self, line: str) -> None:
        with self.lock:
            _print(line)

    def write(self) -> None:
        self.report["wall_s"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / ".gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    def run(self, step: Step) -> dict:
        rec = {"status": "running", "argv": " ".join(step.argv), "log": f"logs/{step.name}.log"}
        part = self.report["parts"][step.part]
        with self.lock:
            part["steps"][step.name] = rec
            part["status"] = "running"
        self._wait_for(step.needs)
        missing = [n for n in step.needs if self.steps.get(n, {}).get("status") != "ok"]
        timeout = step.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        early = self.started.pop(step.name, None)
        if self.stopping:
            rec.update(status="skipped", reason="the check was interrupted")
        elif missing:
            rec.update(status="skipped", reason=f"needs {', '.join(missing)}, which did not pass")
        elif timeout < 5:
            rec.update(status="timeout", reason="the check's --deadline had passed before this step could start")
        else:
            self._execute(step, rec, timeout, early)
            early = None
        if early is not None:  # started ahead but not to be run: stop it
            _stop([early["proc"]])
            self._close(early)
        with self.lock:
            self.steps[step.name] = rec
            part["status"] = parts.part_status([s["status"] for s in part["steps"].values()])
            part["wall_s"] = round(sum(s.get("wall_s", 0) for s in part["steps"].values()), 1)
            self.write()
        if step.name in self.done:
            self.done[step.name].set()
        self.say(f"[gpu_check] {step.name}: {rec['status']}" + (f" in {rec['wall_s']} s" if "wall_s" in rec else "")
                 + (f" ({rec['reason']})" if rec.get("reason") else ""))
        return rec

    def prestart(self, step: Step) -> None:
        """Start a step's child ahead of its turn: it imports (10-13 s on the GPU node, off the critical path),
        then waits for its go file (Step.go), which run() creates when the step's turn comes."""
        self.started[step.name] = self._launch(step, f"logs/{step.name}.log")
        self.say(f"[gpu_check] {step.name}: started ahead (imports), waits for its turn")

    def _launch(self, step: Step, log_rel: str) -> dict:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
               "WANDB_MODE": "offline", **step.env, **({"GPU_CHECK_GO": step.go} if step.go else {})}
        if step.go:
            Path(step.go).unlink(missing_ok=True)
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        log = open(self.out / log_rel, "w")  # noqa: SIM115  (closed by _close)
        proc = subprocess.Popen(step.argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        self.live.add(proc)
        reader = threading.Thread(target=self._pump, args=(proc, step.name, log, tail), daemon=True)
        reader.start()
        return {"proc": proc, "reader": reader, "tail": tail, "log": log, "t0": time.monotonic()}

    def _close(self, h: dict) -> None:
        self.live.discard(h["proc"])
        h["reader"].join(timeout=10)
        h["log"].close()

    def _execute(self, step: Step, rec: dict, timeout: float, h: dict | None = None) -> None:
        self.say(f"[gpu_check] {step.name}: {'go' if h else 'start'} (timeout {timeout:.0f} s): {rec['argv']}")
        if h is None:
            h = self._launch(step, rec["log"])
        else:
            rec["started_ahead_s"] = round(time.monotonic() - h["t0"], 1)
            Path(step.go).touch()
        proc, tail, t0 = h["proc"], h["tail"], time.monotonic()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            _stop([proc])
        finally:
            self._close(h)
        if self.stopping and rc != 0:
            rc, timeout = None, None  # stopped by abort(): reported as cut short, not as its own failure
        rec.update(rc=rc, wall_s=round(time.monotonic() - t0, 1))
        if rc in step.skip_rc:
            rec.update(status="skipped", reason=step.skip_rc[rc])
            return
        cut = "stopped: the check was interrupted" if timeout is None else f"killed after {timeout:.0f} s"
        problems = [] if rc == 0 else [cut if rc is None else f"exit code {rc}"]
        if step.collect is not None:  # also after a timeout: the trials leave the jobs they finished
            try:
                figures, found = step.collect({"rc": rc, "wall_s": rec["wall_s"], "tail": list(tail),
                                               "log_path": str(self.out / rec["log"])})
                with self.lock:
                    merge(self.report["parts"][step.part]["figures"], figures)
                problems += found
            except Exception as exc:  # noqa: BLE001  (a collector's bug is this step's failure, not the check's)
                problems.append(f"collecting the figures failed: {type(exc).__name__}: {exc}")
        rec["status"] = "timeout" if rc is None else "failed" if problems else "ok"
        if rc is None:
            rec["reason"] = problems[0]
        if problems:
            rec.update(problems=problems[:20], tail=list(tail))

    def _pump(self, proc, name: str, log, tail: deque) -> None:
        for line in proc.stdout:
            log.write(line)
            log.flush()
            line = line.rstrip("\n")
            if line.strip():
                tail.append(line)
                self.say(f"[{name}] {line}")

    def abort(self) -> None:
        """The check itself was interrupted (Ctrl-C, SIGTERM): stop every child (each runs in its own session, so
        the terminal's signal does not reach it), run nothing more."""
        self.stopping = True
        _stop(list(self.live))
        for t in self.threads:  # let each lane record how its step ended before the report is written
            t.join(timeout=15)

    def finish(self) -> int:
        ps = self.report["parts"]
        for name, part in self.planned.items():
            if name not in ps[part]["steps"]:
                if self.not_run:
                    ps[part]["steps"][name] = {"status": "skipped", "reason": f"not run: {self.not_run}"}
                else:
                    why = "the check was interrupted" if self.stopping else "the check ended first"
                    ps[part]["steps"][name] = {"status": "timeout", "reason": f"not run: {why}"}
        for p in ps.values():
            for s in p["steps"].values():
                if s["status"] == "running":  # the check was interrupted while it ran
                    s.update(status="failed", reason="the check was interrupted while this step ran")
            p["status"] = parts.part_status([s["status"] for s in p["steps"].values()]) if p["steps"] else "skipped"
        self.report["failed"] = [n for n, p in ps.items() if p["status"] in ("failed", "timeout")]
        self.report["ok"] = not self.report["failed"]
        self.report["finished_at"] = _now()
        self.report["within_budget"] = time.monotonic() - self.t0 <= BUDGET_S if self.mode == "cuda" else None
        self.write()
        _print("\n".join(parts.summary_lines(self.report, self.out)))
        return 0 if self.report["ok"] else 1


def _print(text: str) -> None:
    """stdout may be gone (a closed pipe): the check goes on, its report and logs are in --out."""
    try:
        print(text, flush=True)
    except (BrokenPipeError, OSError):
        pass


def merge(into: dict, new: dict) -> None:
    """The figures of a part's steps side by side: a key two steps both fill (e.g. `runs`) is merged one level."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            into[k].update(v)
        else:
            into[k] = v


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process group (the harness checkpoints and stops on it), SIGKILL to those left 15 s later."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + wait
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        procs = [p for p in procs if p.poll() is None]
        if not procs:
            return


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _git() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ("+dirty" if dirty else "")) or None


def run_lanes(check: Check, lanes: list[list[Step]], jobs: int) -> None:
    """Each lane's steps in order; up to `jobs` lanes at once (1: one lane after the other)."""
    if jobs <= 1:
        for lane in lanes:
            for step in lane:
                check.run(step)
        return
    pending = list(lanes)
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        threads = [threading.Thread(target=lambda ln=lane: [check.run(s) for s in ln], daemon=True) for lane in batch]
        check.threads = threads
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the dry run on CPU (float32, the tiny fixture, 2 steps)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "outputs/gpu_check",
                    help="where gpu_check.json and the logs go (default: $OUT, else outputs/gpu_check)")
    ap.add_argument("--work", default=None, help="runs, fixtures and the 3B checkpoint (default: a temp dir; the "
                                                 "3B part needs ~45 GB free there)")
    ap.add_argument("--keep-work", action="store_true", help="keep --work at the end")
    ap.add_argument("--deadline", type=float, default=None,
                    help=f"seconds for the whole check; steps still to run after it are cut (default {BUDGET_S - 10} "
                         "on CUDA, none with --cpu; 0 = none)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps of the 3B LoRA trials (default 3; "
                                                            "--cpu: 2)")
    ap.add_argument("--full-steps", type=int, default=2, help="optimizer steps of the 3B full-tuning trials "
                                                              "(default 2)")
    ap.add_argument("--parts", default=",".join(parts.PARTS), help="comma-separated subset of " + ",".join(parts.PARTS))
    ap.add_argument("--jobs", type=int, default=None, help="lanes at once before the 3B trials (default: all four "
                                                            "on CUDA, 1 with --cpu)")
    args = ap.parse_args(argv)
    wanted = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(parts.PARTS))
    if unknown:
        ap.error(f"--parts: unknown {unknown}; choose from {list(parts.PARTS)}")
    args.steps = args.steps or (2 if args.cpu else 3)
    if args.steps < 2 or args.full_steps < 1:
        ap.error("--steps must be >= 2 (the first step is warm-up) and --full-steps >= 1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    deadline = args.deadline if args.deadline is not None else (None if args.cpu else BUDGET_S - 10)
    cfg = parts.Config(cpu=args.cpu, work=work, python=sys.executable, steps=args.steps, full_steps=args.full_steps)
    meta = {"python": sys.executable, "git": _git(), "work_dir": str(work), "deadline_s": deadline or None,
            "settings": cfg.describe(), "parts_selected": wanted}
    check = Check(out, "cpu" if args.cpu else "cuda", deadline or None, meta)
    env_step, lanes, trials = parts.plan_steps(cfg, set(wanted))
    check.plan([env_step, *(s for lane in lanes for s in lane), *trials])
    def interrupted(signum, frame):
        for sig in (signal.SIGTERM, signal.SIGINT):  # once: a second signal must not cut abort() short
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        check.run(env_step)
        if check.steps[env_step.name]["status"] != "ok" and not args.cpu:
            check.not_run = "no usable CUDA device (env)"
            check.say(f"[gpu_check] {check.not_run}: the other parts are not run")
        else:
            for step in trials:
                if step.go:
                    check.prestart(step)
            run_lanes(check, lanes, args.jobs or (1 if args.cpu else len(lanes)))
            for step in trials:
                check.run(step)
    except KeyboardInterrupt as exc:
        check.say(f"[gpu_check] interrupted ({exc or 'Ctrl-C'}): stopping the running steps")
        check.report["interrupted"] = True
        check.abort()
    finally:
        code = check.finish()
        if not args.keep_work and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
