"""The driver form of a multi-process job: `python -m harness placement=ddp placement.num_processes=N ...`.

Hydra runs once, in this outer process (so a multirun sweep of multi-process jobs works, and no rank
makes its own `${now:}` folder). The outer process writes the resolved plan to
<output_root>/launch/<run_name>/plan.json and starts `accelerate launch` with the placement's
Accelerate config as a child; every rank loads that plan file (HARNESS_PLAN) instead of composing,
so all ranks run exactly the plan that was printed and checked here. The child's exit code is the
job's. Torch-free: the ranks import torch, this process does not.

Several machines (placement.num_machines > 1): the same driver runs on every machine and starts that machine's
placement.num_processes ranks; the machines meet at the main address and port of machine 0. Where they come from
(`Machine.of`): NODE_RANK, MASTER_ADDR and MASTER_PORT when set (any cluster, by hand), else SLURM's job (its node
id, its first node's address, a port derived from the job id: hydra/launcher=slurm starts one driver per node
with srun).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError, Problem
from harness.halt import STOP_ON_USR2_ENV, defer, interrupted, scheduler_handler_of
from harness.identity import REPO_ROOT
from harness.rundir import atomic_write_json, read_json

log = logging.getLogger("harness")
PLAN_ENV = "HARNESS_PLAN"
EXIT_ENV = "HARNESS_EXIT_FILE"  # each machine's local rank 0 writes its exit code there
REPO = REPO_ROOT


@dataclass(frozen=True)
class Machine:
    """This machine's place in the job: its rank among placement.num_machines, and where machine 0 listens."""

    rank: int = 0
    main_address: str = "127.0.0.1"
    main_port: int | None = None  # None: a free port of this machine (one machine only)
    source: str = "one machine"

    @classmethod
    def of(cls, plan, environ=None) -> "Machine":
        """From NODE_RANK / MASTER_ADDR / MASTER_PORT, else SLURM's job; a ConfigError naming what is missing."""
        env = os.environ if environ is None else environ
        n = plan.cfg.placement.num_machines
        port = _int_env(env, "MASTER_PORT")
        if n == 1:
            return cls(0, "127.0.0.1", port, "one machine")
        if "NODE_RANK" in env or "MASTER_ADDR" in env:
            missing = [k for k in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
            if missing:
                raise _machines_error(n, f"{', '.join(missing)} not set (NODE_RANK, MASTER_ADDR and MASTER_PORT go "
                                         "together)")
            machine = cls(_int_env(env, "NODE_RANK"), env["MASTER_ADDR"], port, "NODE_RANK/MASTER_ADDR/MASTER_PORT")
        elif env.get("SLURM_JOB_ID"):
            from harness import slurm

            nodes = slurm.job_nodes(env)
            if len(nodes) != n:
                raise _machines_error(n, f"this SLURM job has {len(nodes)} node(s) ({', '.join(nodes)})",
                                      f"submit it with {n} nodes (hydra/launcher=slurm asks for "
                                      "placement.num_machines nodes), or set placement.num_machines="
                                      f"{len(nodes)}")
            machine = cls(int(env.get("SLURM_NODEID", "0")), slurm.node_address(nodes[0]),
                          port or slurm.job_port(env["SLURM_JOB_ID"]), f"SLURM job {env['SLURM_JOB_ID']}")
        else:
            raise _machines_error(n, "neither NODE_RANK/MASTER_ADDR/MASTER_PORT nor a SLURM job says which machine "
                                     "this is")
        if not 0 <= machine.rank < n:
            raise _machines_error(n, f"this machine's rank is {machine.rank} ({machine.source})",
                                  f"machine ranks go from 0 to {n - 1}")
        return machine


def _int_env(env, key: str) -> int | None:
    value = env.get(key)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError([Problem(key, value, "must be an integer", f"set {key} to a number")]) from None


def _machines_error(n: int, why: str, fix: str | None = None) -> ConfigError:
    return ConfigError([Problem("placement.num_machines", n, why, fix or (
        "run the same command on every machine with NODE_RANK=<0.." + str(n - 1) + "> MASTER_ADDR=<machine 0's "
        "address> MASTER_PORT=<a free port there>, or submit it with hydra/launcher=slurm (one job over "
        "placement.num_machines nodes)"))])


def needs_launch(plan) -> bool:
    """A training job asks for several processes (on one machine or several) but this is not one of their ranks."""
    from harness import dist

    c = plan.cfg
    return c.placement.world_size > 1 and not dist.is_multi() and c.mode == "train"


def launch_command(plan, machine: Machine | None = None) -> list[str]:
    """`accelerate launch` for this machine's ranks: the job's world size, the machines and where they meet."""
    p = plan.cfg.placement
    machine = machine or Machine()
    acc = str(REPO / p.accelerate_config) if p.accelerate_config else None
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if acc:
        cmd += ["--config_file", acc]
    # The harness sets precision itself (model.dtype -> TrainingArguments.bf16), not the launcher.
    # --num_processes is accelerate's total over every machine.
    cmd += ["--num_processes", str(p.world_size), "--num_machines", str(p.num_machines), "--dynamo_backend", "no",
            "--mixed_precision", "no"]
    if p.num_machines > 1:
        cmd += ["--machine_rank", str(machine.rank), "--main_process_ip", machine.main_address]
    if p.kind == "ddp":
        # On a CPU node this gives MULTI_CPU ranks over gloo; `--cpu` would silently run ONE process (docs/platform.md).
        cmd += ["--multi_gpu"]
    port = machine.main_port or _free_port()
    cmd += ["--main_process_port", str(port), "-m", "harness"]
    return cmd


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(plan) -> int:
    """Write the plan, start this machine's ranks, wait; their exit code is returned. A scheduler's requeue
    signal (submitit's SIGUSR2) that stopped them is deferred to the entry point (harness.halt.hand_over)."""
    machine = Machine.of(plan)
    suffix = "" if machine.rank == 0 else f".machine-{machine.rank}"  # each machine its own copy: no write races
    plan_file = Path(plan.cfg.output_root) / "launch" / plan.run_name / f"plan{suffix}.json"
    atomic_write_json(plan_file, plan.to_json())
    cmd = launch_command(plan, machine)
    p = plan.cfg.placement
    where = f" on machine {machine.rank} of {p.num_machines} ({machine.source}, main {machine.main_address})" \
        if p.num_machines > 1 else ""
    log.info("launching %d ranks (%s)%s: %s", p.num_processes, p.name, where, " ".join(cmd))
    exit_file = plan_file.with_name(f"exit_code{suffix}")
    exit_file.unlink(missing_ok=True)
    env = {**os.environ, PLAN_ENV: str(plan_file), EXIT_ENV: str(exit_file)}
    scheduler = scheduler_handler_of(signal.getsignal(signal.SIGUSR2))
    if scheduler is not None:  # SLURM signals every process of the job: the ranks stop on it too (harness.halt)
        env[STOP_ON_USR2_ENV] = "1"
    # torchrun's agent (accelerate launch) starts with SIGUSR2 ignored, which its ranks inherit until their training
    # takes it: the scheduler's signal must not kill it (or a rank outside training) mid-step
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True, preexec_fn=_ignore_usr2)
    try:
        with _forwarding_signals(proc, scheduler) as fwd:  # SIGTERM / SIGINT (/ SIGUSR2): every rank stops after its step
            code = proc.wait()
        if code and exit_file.is_file():  # local rank 0's own code is more precise than the launcher's 1 ...
            code = int(exit_file.read_text().strip() or 0) or code  # ... unless it succeeded and another failed
        if fwd.received == signal.SIGUSR2 and interrupted(code):
            defer(scheduler, signal.SIGUSR2)  # submitit: requeue the job once its record is written
        return code
    except BaseException:  # Ctrl-C / a killed sweep: take the ranks down with us
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


def _ignore_usr2() -> None:  # in the child, before exec: SIG_IGN survives exec, a Python handler would not
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class _forwarding_signals:
    """While the ranks run: a stop signal to this driver is passed on to their process group (their own session,
    so a terminal's Ctrl-C reaches only this process), and the driver keeps waiting for their checkpoint.
    torchrun's agent, in that group too, gives the ranks 30 s after it gets the signal before it kills them.
    SIGUSR1 (dump the stacks, harness.diagnostics) goes to the ranks alone, and so does SIGUSR2 when a scheduler
    installed a handler for it here (`scheduler`: submitit's requeue; torchrun's agent would die of either)."""

    def __init__(self, proc: subprocess.Popen, scheduler=None):
        self.proc, self.scheduler, self.previous = proc, scheduler, {}
        self.received: int | None = None  # the first stop signal passed on

    def __enter__(self):
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self._forward)
            self.previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._dump_ranks)
            if self.scheduler is not None:
                self.previous[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, self._to_ranks)
        return self

    def __exit__(self, *exc):
        for sig, prev in self.previous.items():
            signal.signal(sig, prev)

    def _dump_ranks(self, signum, frame):
        """SIGUSR1: to the ranks only (each writes its stacks, harness.diagnostics); torchrun's agent would die of it."""
        ranks = _children(self.proc.pid)
        log.warning("SIGUSR1: passed on to the ranks (pids %s): stacks in <run_dir>/diagnostics/",
                    ", ".join(map(str, ranks)) or "none found")
        self._signal_ranks(ranks, signum)

    def _to_ranks(self, signum, frame):
        """The scheduler's SIGUSR2: each rank stops after its step with a checkpoint; the scheduler's own handler
        runs once they have (launch defers it)."""
        self.received = self.received or signum
        ranks = _children(self.proc.pid)
        log.warning("%s: passed on to the ranks (pids %s); waiting for their checkpoint, then the scheduler's "
                    "requeue", signal.Signals(signum).name, ", ".join(map(str, ranks)) or "none found")
        self._signal_ranks(ranks, signum)

    @staticmethod
    def _signal_ranks(ranks: list[int], signum: int) -> None:
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    def _forward(self, signum, frame):
        self.received = self.received or signum
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
    """In a rank started by `launch`: each machine's local rank 0 leaves its exit code for that machine's driver."""
    path = os.environ.get(EXIT_ENV)
    if path and int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))) == 0:
        Path(path).write_text(f"{int(code)}\n")


def plan_from_env():
    """In a rank started by `launch`: the plan the driver wrote, or None."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    from harness.plan import Plan

    return Plan.from_json(read_json(path))
