"""The ranks of a multi-process launch (`accelerate launch ... -m harness`), as the lifecycle sees them.

Every rank composes the same plan and derives the same run dir. Rank 0 claims the run dir (lock,
manifest), prepares data and model caches, writes every shared file (manifest, metrics, checkpoint
manifests, final policy, eval, completion); every rank writes its own ledger and trace
(ledgers/rank-<r>.jsonl, traces/rank-<r>.jsonl). Decisions that one rank makes (claim outcome,
resume point) are broadcast so all ranks act alike; collectives are called by every rank in the
same order.

The process group is initialized here, before the Trainer exists, with Accelerate's PartialState
(gloo on CPU, nccl on GPU), so TrainingArguments later reuses it. A single process never imports
torch.distributed through this module.
"""

from __future__ import annotations

import os

from harness.errors import HarnessError


def world_size() -> int:
    """Processes of this launch, from the launcher's environment (1 when not launched)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_multi() -> bool:
    return world_size() > 1


def is_main() -> bool:
    return rank() == 0


def init(device: str, timeout_s: float = 1800) -> None:
    """Initialize the process group once per process (no-op for a single process). `timeout_s`
    (placement.collective_timeout_s): how long a collective waits for a rank that does not come before it fails,
    so a job whose other process or node died ends with an error instead of waiting for ever."""
    if not is_multi():
        return
    from datetime import timedelta

    from accelerate import PartialState

    PartialState(cpu=(device == "cpu"), timeout=timedelta(seconds=timeout_s))


def barrier() -> None:
    if is_multi():
        import torch.distributed as dist

        dist.barrier()


def broadcast(obj, src: int = 0):
    """`obj` of rank `src` on every rank (a picklable object)."""
    if not is_multi():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not is_multi():
        return [obj]
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_int(value: int, op: str) -> int:
    """`value` reduced over every rank, `op` "min" | "max", on every rank: e.g. every rank stops at the same step
    when any one must. The tensor lives where the backend reduces (CUDA for nccl, CPU for gloo)."""
    if not is_multi():
        return int(value)
    import torch
    import torch.distributed as dist

    nccl = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = f"cuda:{torch.cuda.current_device()}" if nccl else "cpu"
    t = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op={"min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return int(t.item())


class PeerLostError(HarnessError):
    """A collective failed: another rank of the job stopped answering (its process or node died, or it hung past
    placement.collective_timeout_s). Every file of the run is as its newest checkpoint left it: resumable (exit 12)."""

    exit_code = 12

    def __init__(self, detail: str, checkpoint: str | None, timeout_s: float):
        self.detail, self.checkpoint = detail, checkpoint
        kept = f"{checkpoint} is the newest complete checkpoint" if checkpoint else "no checkpoint was published yet"
        super().__init__(
            f"PeerLostError: rank {rank()} of {world_size()}: another rank of this job stopped answering in a "
            f"collective ({detail}). Its process or machine died (its own log says why), or it hung longer than "
            f"placement.collective_timeout_s={timeout_s:g} s. {kept}.\n"
            "    fix: run the same command again to resume from it (on SLURM: `scontrol requeue <job id>`, or the same "
            "sweep command; SLURM requeues a job whose node failed by itself when it was submitted with --requeue)")


def peer_lost(exc: BaseException) -> str | None:
    """When `exc` (raised on a rank of a multi-process job) is a failed collective, its first line; else None.
    torch raises DistBackendError and kin, or a RuntimeError from gloo's / NCCL's transport ("Connection reset by
    peer", "Timed out waiting ... for recv")."""
    if not is_multi():
        return None
    for e in (exc, exc.__cause__, exc.__context__):
        if e is None:
            continue
        name, text = type(e).__name__, str(e).strip()
        if name in ("DistBackendError", "DistNetworkError", "DistStoreError") or (
                isinstance(e, RuntimeError) and any(s in text.lower() for s in ("gloo", "nccl", "c10d"))):
            return f"{name}: {(text.splitlines() or [''])[0][:300]}"
    return None


class RankAbort(HarnessError):
    """Raised on ranks > 0 when rank 0 failed a decision it makes for everyone (rank 0 reports the error)."""

    def __init__(self, exit_code: int, what: str):
        self.exit_code = exit_code
        super().__init__(f"rank {rank()}: stopping because rank 0 failed ({what})")


def on_main(fn, *args, **kwargs):
    """`fn` evaluated on rank 0 and its result broadcast. If it raises, rank 0 re-raises the error and the other
    ranks raise RankAbort with its exit code, so no rank waits forever in a later collective."""
    if not is_multi():
        return fn(*args, **kwargs)
    out, err = None, None
    if is_main():
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (told to the other ranks, then re-raised)
            err = exc
    msg = broadcast({"out": out, "failed": None if err is None else type(err).__name__,
                     "code": getattr(err, "exit_code", 1)})
    if err is not None:
        raise err
    if msg["failed"] is not None:
        raise RankAbort(msg["code"], msg["failed"])
    return msg["out"]


def main_first(fn, *args, **kwargs):
    """Run `fn` on rank 0, then on the other ranks (e.g. building a cache that the others then reuse)."""
    out = on_main(fn, *args, **kwargs)
    return fn(*args, **kwargs) if is_multi() and not is_main() else out
