"""The driver form of a multi-process job: `python -m harness placement=ddp placement.num_processes=N ...`.

Hydra runs once, in this outer process (so a multirun sweep of multi-process jobs works, and no rank
makes its own `${now:}` folder). The outer process writes the resolved plan to
<output_root>/launch/<run_name>/plan.json and starts `accelerate launch` with the placement's
Accelerate config as a child; every rank loads that plan file (HARNESS_PLAN) instead of composing,
so all ranks run exactly the plan that was printed and checked here. The child's exit code is the
job's. Torch-free: the ranks import torch, this process does not.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from harness.identity import REPO_ROOT
from harness.rundir import atomic_write_json, read_json

log = logging.getLogger("harness")
PLAN_ENV = "HARNESS_PLAN"
EXIT_ENV = "HARNESS_EXIT_FILE"  # rank 0 writes its exit code there
REPO = REPO_ROOT


def needs_launch(plan) -> bool:
    """A training job asks for several processes but this is not one of their ranks."""
    from harness import dist

    c = plan.cfg
    return c.placement.num_processes > 1 and not dist.is_multi() and c.mode == "train"


def launch_command(plan) -> list[str]:
    p = plan.cfg.placement
    acc = str(REPO / p.accelerate_config) if p.accelerate_config else None
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if acc:
        cmd += ["--config_file", acc]
    # The harness sets precision itself (model.dtype -> TrainingArguments.bf16), not the launcher.
    cmd += ["--num_processes", str(p.num_processes), "--num_machines", "1", "--dynamo_backend", "no",
            "--mixed_precision", "no"]
    if p.kind == "ddp":
        # On a CPU node this gives MULTI_CPU ranks over gloo; `--cpu` would silently run ONE process (docs/platform.md).
        cmd += ["--multi_gpu"]
    port = os.environ.get("MASTER_PORT") or str(_free_port())
    cmd += ["--main_process_port", port, "-m", "harness"]
    return cmd


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(plan) -> int:
    """Write the plan, start the ranks, wait; the ranks' exit code is returned."""
    plan_file = Path(plan.cfg.output_root) / "launch" / plan.run_name / "plan.json"
    atomic_write_json(plan_file, plan.to_json())
    cmd = launch_command(plan)
    log.info("launching %d ranks (%s): %s", plan.cfg.placement.num_processes, plan.cfg.placement.name, " ".join(cmd))
    exit_file = plan_file.with_name("exit_code")
    exit_file.unlink(missing_ok=True)
    env = {**os.environ, PLAN_ENV: str(plan_file), EXIT_ENV: str(exit_file)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    try:
        with _forwarding_signals(proc):  # SIGTERM / SIGINT: every rank stops after its step (harness.halt)
            code = proc.wait()
        if code and exit_file.is_file():  # rank 0's own code is more precise than the launcher's 1 ...
            code = int(exit_file.read_text().strip() or 0) or code  # ... unless rank 0 succeeded and another failed
        return code
    except BaseException:  # Ctrl-C / a killed sweep: take the ranks down with us
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


class _forwarding_signals:
    """While the ranks run: a stop signal to this driver is passed on to their process group (their own session,
    so a terminal's Ctrl-C reaches only this process), and the driver keeps waiting for their checkpoint.
    torchrun's agent, in that group too, gives the ranks 30 s after it gets the signal before it kills them.
    SIGUSR1 (dump the stacks, harness.diagnostics) goes to the ranks alone."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.previous = proc, {}

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._forward)
            self.previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._dump_ranks)
        return self

    def __exit__(self, *exc):
        for sig, prev in self.previous.items():
            signal.signal(sig, prev)

    def _dump_ranks(self, signum, frame):
        """SIGUSR1: to the ranks only (each writes its stacks, harness.diagnostics); torchrun's agent would die of it."""
        ranks = _children(self.proc.pid)
        log.warning("SIGUSR1: passed on to the ranks (pids %s): stacks in <run_dir>/diagnostics/",
                    ", ".join(map(str, ranks)) or "none found")
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    def _forward(self, signum, frame):
        log.warning("%s: passed on to the ranks; waiting for their checkpoint", signal.Signals(signum).name)
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc): under `accelerate launch`, its ranks."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:  # after "pid (comm)": state, ppid, ...
            out.append(int(stat.parent.name))
    return sorted(out)


def report_exit(code: int) -> None:
    """In a rank started by `launch`: rank 0 leaves its exit code for the driver."""
    from harness import dist

    path = os.environ.get(EXIT_ENV)
    if path and dist.is_main():
        Path(path).write_text(f"{int(code)}\n")


def plan_from_env():
    """In a rank started by `launch`: the plan the driver wrote, or None."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    from harness.plan import Plan

    return Plan.from_json(read_json(path))
