"""Digests of training state: trainable parameters, optimizer, scheduler and every RNG stream.

Recorded in each checkpoint's harness_checkpoint.json at save time; the resume audit recomputes
them after the trainer restored a checkpoint in a new process and compares. Imports torch: call
only from the training process.

Two formats (the checkpoint manifest's "digests"; harness.accounting.filedigest.FORMAT):

    2  xxh3-128. A tensor contributes its dtype, shape and the xxh3-128 of its bytes, hashed in place (no copy
       of a CPU tensor); a `memo` lets one checkpoint hash each tensor's bytes once for the state digests and the
       file digests of the files that hold them (harness.accounting.tensorfiles).
    1  sha256 over the same walk with each tensor's bytes fed to the one hash (checkpoints written before
       format 2; a resume from one is audited in its format). Also without a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import numpy as np
import torch
import xxhash

FORMAT = 2

Memo = dict  # (device, data pointer, byte length) -> xxh3-128 digest of those bytes, for one checkpoint


def _host_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a uint8 array: a view of its memory (a CPU tensor, contiguous), else a host copy."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy()


def tensor_key(t: torch.Tensor) -> tuple:
    return (str(t.device), t.data_ptr(), t.numel() * t.element_size())


def _bytes_digest(t: torch.Tensor) -> bytes:
    return xxhash.xxh3_128(_host_bytes(t) if t.numel() else b"").digest()


def tensor_digest(t: torch.Tensor, memo: Memo | None = None) -> bytes:
    """xxh3-128 of the tensor's bytes; looked up in (and added to) `memo` when it is a contiguous tensor."""
    key = tensor_key(t) if memo is not None and t.is_contiguous() else None
    if key is not None and key in memo:
        return memo[key]
    d = _bytes_digest(t)
    if key is not None:
        memo[key] = d
    return d


HASH_THREADS = max(1, min(8, os.cpu_count() or 1))  # xxhash releases the GIL: tensors hash side by side
_PARALLEL_MIN = 1 << 20  # tensors below this are hashed by the walk itself: a thread's hand-off costs more


def tensors_in(obj: Any) -> Iterable[torch.Tensor]:
    """Every tensor in nested dicts, lists and tuples (the walk `_update_obj` takes)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors_in(x)


def _hashed_apart(t: torch.Tensor) -> bool:
    """A tensor worth a thread's hand-off: large, contiguous, on the CPU (its bytes hashed in place)."""
    return t.device.type == "cpu" and t.is_contiguous() and t.numel() * t.element_size() >= _PARALLEL_MIN


def fill_memo(objs: Iterable[Any], memo: Memo, threads: int = HASH_THREADS) -> Memo:
    """Hash the large contiguous CPU tensors in `objs` into `memo` on `threads` threads, so that the walk that
    follows (`digest(..., memo=memo)`) only looks them up. The digests are those the walk would take itself (the
    same function of the same bytes), so the result never depends on `threads`; only the time does."""
    todo: dict[tuple, torch.Tensor] = {}
    for obj in objs:
        for t in tensors_in(obj):
            if _hashed_apart(t):
                key = tensor_key(t)
                if key not in memo:
                    todo.setdefault(key, t)
    keys = sorted(todo, key=lambda k: -k[2])  # largest first: the threads finish together
    tensors = [todo[k] for k in keys]
    if threads <= 1 or len(keys) < 2:
        memo.update(zip(keys, map(_bytes_digest, tensors)))
        return memo
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="harness-digest") as pool:
        memo.update(zip(keys, pool.map(_bytes_digest, tensors)))
    return memo


class Pipeline:
    """Tensors hashed into `memo` on one worker thread as they are handed over, so that the hashing overlaps
    whatever the caller does next (the resume audit: the loaded weights, then each optimizer storage as torch.load
    reads it). Each handed tensor is held until `release`: a memo key is a memory address, which must not be
    reused by another tensor while the memo is read. The digests are those fill_memo takes (the same function of
    the same bytes); a tensor the thread fails on is left to the walk."""

    def __init__(self, memo: Memo):
        import queue
        import threading

        self.memo, self.held = memo, []
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="harness-audit", daemon=True)
        self._thread.start()

    def add(self, t: torch.Tensor) -> None:
        if _hashed_apart(t):
            self.held.append(t)
            self._queue.put(t)

    def _work(self) -> None:
        while (t := self._queue.get()) is not None:
            key = tensor_key(t)
            if key not in self.memo:
                try:
                    self.memo[key] = _bytes_digest(t)
                except Exception:  # noqa: BLE001 (the walk hashes it and meets the error there)
                    pass

    def end(self) -> None:
        """No more tensors: the thread finishes those handed over and stops."""
        self._queue.put(None)

    def join(self) -> None:
        self.end()
        self._thread.join()

    def release(self) -> None:
        self.held.clear()


def storage_bytes(storage) -> torch.Tensor:
    """An untyped storage's bytes as a uint8 tensor over the same memory (no copy): its memo key and digest are
    those of a tensor that spans the whole storage."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _update_obj(h, obj: Any, fmt: int, memo: Memo | None) -> None:
    """Hash nested containers of tensors and plain values in a stable order."""
    if isinstance(obj, torch.Tensor):
        h.update(f"{obj.dtype}{tuple(obj.shape)}".encode())
        if fmt >= 2:
            h.update(tensor_digest(obj, memo))
        elif obj.numel():
            h.update(_host_bytes(obj))
    elif isinstance(obj, np.ndarray):
        h.update(f"nd{obj.dtype}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).reshape(-1).view(np.uint8))
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(f"k:{k!s};".encode())
            _update_obj(h, obj[k], fmt, memo)
    elif isinstance(obj, (list, tuple)):
        h.update(f"l{len(obj)};".encode())
        for x in obj:
            _update_obj(h, x, fmt, memo)
    else:
        h.update(json.dumps(obj, default=repr).encode())


def digest(obj: Any, fmt: int = FORMAT, memo: Memo | None = None) -> str:
    if fmt not in (1, 2):
        raise ValueError(f"unknown state digest format {fmt!r} (this harness knows 1 and 2)")
    h = xxhash.xxh3_128() if fmt >= 2 else hashlib.sha256()
    _update_obj(h, obj, fmt, memo)
    return h.hexdigest()


def params_digest(model: torch.nn.Module, fmt: int = FORMAT, memo: Memo | None = None) -> str:
    """Trainable parameters only (a frozen base is covered by the model identity)."""
    return digest({n: p for n, p in model.named_parameters() if p.requires_grad}, fmt, memo)


def optimizer_state(optimizer: Any) -> dict | None:
    """The optimizer's state_dict (what the Trainer saves to optimizer.pt): references to its state tensors."""
    return None if optimizer is None else getattr(optimizer, "optimizer", optimizer).state_dict()  # accelerate wraps it


def optimizer_digest(optimizer: Any, fmt: int = FORMAT, memo: Memo | None = None) -> str | None:
    state = optimizer_state(optimizer)
    return None if state is None else digest(state, fmt, memo)


def scheduler_digest(scheduler: Any, fmt: int = FORMAT) -> str | None:
    return None if scheduler is None else digest(scheduler.state_dict(), fmt)


HOST_RNG_STREAMS = ("python", "numpy", "torch_cpu")  # always digested; "cuda" only where CUDA is in use


def rng_digests(fmt: int = FORMAT) -> dict[str, str | None]:
    """Every RNG stream the Trainer checkpoints: the host ones (HOST_RNG_STREAMS) and cuda (None without CUDA)."""
    out = {
        "python": digest(list(random.getstate()), fmt),
        "numpy": digest(list(np.random.get_state()), fmt),
        "torch_cpu": digest(torch.get_rng_state(), fmt),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = digest(torch.cuda.get_rng_state_all(), fmt)
    return out


def adapters_digest(model: torch.nn.Module, fmt: int = FORMAT, memo: Memo | None = None) -> str | None:
    """Every PEFT adapter's weights, frozen ones included (with beta > 0, TRL keeps the reference policy as
    a frozen "ref" adapter next to the trained "default" one: restoring only one of them would go unseen
    by a trainable-parameters digest). None for a model without adapters."""
    if not hasattr(model, "peft_config"):
        return None
    return digest({n: p for n, p in model.named_parameters() if "lora_" in n or "modules_to_save" in n}, fmt, memo)


def state_digests(model, optimizer, scheduler, fmt: int = FORMAT, memo: Memo | None = None) -> dict:
    """`memo`: digests of tensor bytes already taken in this checkpoint (only for the long-lived tensors:
    parameters and optimizer state, whose memory cannot have been reused since)."""
    return {
        "params": params_digest(model, fmt, memo),
        "adapters": adapters_digest(model, fmt, memo),
        "optimizer": optimizer_digest(optimizer, fmt, memo),
        "scheduler": scheduler_digest(scheduler, fmt),
        "rng": rng_digests(fmt),
    }
