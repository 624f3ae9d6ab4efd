"""Fault injection for the fault-matrix tests (tests/integration/test_faults.py); never set outside tests.

    HARNESS_FAULT="<point>[@<n>]:<action>[;<point>[@<n>]:<action>...]"

makes the n-th time (1-based, default 1) this process reaches the named point do the action (several faults,
separated by `;`, each at its own point: e.g. a trainer killed at a step while its sampler dies every third round):

    kill    SIGKILL this process: a crash, no handler and no cleanup runs
    enospc  raise OSError(ENOSPC) from the write there, as a full disk would; likewise edquot (quota),
            erofs (a read-only filesystem), eacces (permission), eio (an I/O error)
    hold    wait there until this process receives a stop signal (harness.halt) or the file named by
            HARNESS_HOLD_FILE exists, 300 s at most, and say so with <that file>.held-<rank> while waiting: a
            test's signal (a scheduler's, a preemption's) then lands at a known step however slow the machine or
            the scheduler; once the test makes the file, a requeued attempt passes without waiting
    defer   (<kind>.check_ahead only) the resume's deep check, begun on a thread at the start, waits until the run
            needs its verdict (after the Trainer's loads): the resume stage then chooses on every other check, as
            when the thread is slower than the data and model stages, and a damaged file is found after the loads

The points (`<kind>` is sft or rl: the SFT warm start and the RL run share a process):

    <kind>.start            the run dir is claimed, before its data and model
    <kind>.check_ahead      the resume's deep check thread starts (harness.run.stages.resume.CheckAhead)
    <kind>.step             the end of an optimizer step (before its checkpoint is saved)
    <kind>.checkpoint       inside a checkpoint save: the Trainer's files written, harness_checkpoint.json not yet
    <kind>.final_policy     final_policy written to its temp dir, not yet renamed
    <kind>.model_card       after the final eval, before final_policy's card is final (harness.card)
    <kind>.completion       before completion.json is written
    sampler.round           rollout=async: the sampler process wrote a round to the buffer (each start of the
                            sampler counts its own rounds: @3 kills every start after its third)
    atomic:<file name>      inside an atomic write of that file: half of it is in the temp file (e.g.
                            atomic:completion.json, atomic:run_manifest.json, atomic:harness_checkpoint.json)
    append:<log path>       inside an append to that log: half of the row is written (e.g.
                            append:ledgers/rank-0.jsonl, append:metrics.jsonl)

Unset, `point` costs one environment lookup.
"""

from __future__ import annotations

import errno
import os
import re
import signal

FAULT_ENV = "HARNESS_FAULT"
HOLD_FILE_ENV = "HARNESS_HOLD_FILE"
HOLD_S = 300.0
ACTIONS = ("kill", "enospc", "edquot", "erofs", "eacces", "eio", "hold", "defer")
_NAMED = re.compile(r"^(sft|rl)\.(start|check_ahead|step|checkpoint|final_policy|model_card|completion)$|^sampler\.round$"
                    r"|^(atomic|append):.+$")
_SPEC = re.compile(r"^(?P<point>[^@]+?)(?:@(?P<n>\d+))?:(?P<action>\w+)$")
_seen: dict[str, int] = {}


def parse(spec: str) -> tuple[str, int, str]:
    """(point, n, action) of a HARNESS_FAULT value; a ValueError that says what is wrong."""
    m = _SPEC.match(spec)
    if not m or not _NAMED.match(m["point"]) or m["action"] not in ACTIONS or m["n"] == "0":
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected <point>[@<n>]:<action> with a point of harness/faults.py, "
                         f"n >= 1 and an action in {ACTIONS}")
    return m["point"], int(m["n"] or 1), m["action"]


def armed() -> bool:
    """Whether a fault is set for this process (a hot path checks this before it splits a write for `point`)."""
    return bool(os.environ.get(FAULT_ENV))


def point(name: str) -> str | None:
    """A place where the fault tests crash the process or fill the disk (see the module docstring). Returns
    "defer" where that is the fault set for this point (the caller defers), else None."""
    specs = os.environ.get(FAULT_ENV)
    if not specs:
        return None
    mine = [(spec, *parse(spec)) for spec in specs.split(";") if spec]
    mine = [(spec, n, action) for spec, target, n, action in mine if target == name]
    if not mine:
        return None
    _seen[name] = _seen.get(name, 0) + 1
    hits = [(spec, action) for spec, n, action in mine if _seen[name] == n]
    if not hits:
        return None
    spec, action = hits[0]
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hold":
        hold()
        return None
    if action == "defer":
        return action
    code = getattr(errno, action.upper())
    raise OSError(code, f"{os.strerror(code)} (injected by {FAULT_ENV}={spec})")


def hold() -> None:
    """Wait until a stop signal reached this process (harness.halt.received) or HARNESS_HOLD_FILE exists (no
    HARNESS_HOLD_FILE: no wait)."""
    import time

    from harness.halt import received

    path, deadline = os.environ.get(HOLD_FILE_ENV), time.monotonic() + HOLD_S
    if not path or os.path.exists(path):
        return
    held = f"{path}.held-{os.environ.get('RANK', '0')}"
    open(held, "w").close()
    while not received() and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.unlink(held)


# --- the smoke check's kill switch (harness.smoke; the fault tests' HARNESS_SMOKE_KILL_*)

KILL_RUN_ENV, KILL_STEP_ENV = "HARNESS_SMOKE_KILL_RUN", "HARNESS_SMOKE_KILL_STEP"
KILL_HOW_ENV = "HARNESS_SMOKE_KILL_HOW"  # sigkill (default: a crash with no cleanup) | raise (an exception mid-training)


class InjectedFault(RuntimeError):
    """The exception a fault-injected run raises (HARNESS_SMOKE_KILL_HOW=raise): a crash inside training."""


def step_callbacks(kind, run_name: str) -> list:
    """The trainer callbacks of a fault test, none in a user's run. In a smoke child (or a fault test): at the end
    of the agreed step of the named run, SIGKILL this process (no cleanup, like a crash) or, with
    HARNESS_SMOKE_KILL_HOW=raise, raise InjectedFault inside training. With HARNESS_FAULT set (harness.faults), the
    point `<kind>.step` at the end of every optimizer step. Given to the trainer last, after the harness's own."""
    from transformers import TrainerCallback

    out = []
    if armed():
        class StepPoint(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                point(f"{kind}.step")

        out.append(StepPoint())
    if os.environ.get(KILL_RUN_ENV) != run_name:
        return out

    step = int(os.environ[KILL_STEP_ENV])
    how = os.environ.get(KILL_HOW_ENV, "sigkill")
    if how not in ("sigkill", "raise"):
        raise ValueError(f"{KILL_HOW_ENV}={how!r}: expected sigkill or raise")

    class KillSwitch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                if how == "raise":
                    raise InjectedFault(f"injected fault at the end of step {step} ({KILL_HOW_ENV}=raise)")
                os.kill(os.getpid(), signal.SIGKILL)

    return [*out, KillSwitch()]
