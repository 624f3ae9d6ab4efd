"""Digests of training state: trainable parameters, optimizer, scheduler and every RNG stream.

Recorded in each checkpoint's harness_checkpoint.json at save time; the resume audit recomputes
them after the trainer restored a checkpoint in a new process and compares. Imports torch: call
only from the training process.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import numpy as np
import torch


def _update_tensor(h: "hashlib._Hash", t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _update_obj(h: "hashlib._Hash", obj: Any) -> None:
    """Hash nested containers of tensors and plain values in a stable order."""
    if isinstance(obj, torch.Tensor):
        _update_tensor(h, obj)
    elif isinstance(obj, np.ndarray):
        h.update(f"nd{obj.dtype}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(f"k:{k!s};".encode())
            _update_obj(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"l{len(obj)};".encode())
        for x in obj:
            _update_obj(h, x)
    else:
        h.update(json.dumps(obj, default=repr).encode())


def digest(obj: Any) -> str:
    h = hashlib.sha256()
    _update_obj(h, obj)
    return h.hexdigest()


def params_digest(model: torch.nn.Module) -> str:
    """Trainable parameters only (a frozen base is covered by the model identity)."""
    return digest({n: p for n, p in model.named_parameters() if p.requires_grad})


def optimizer_digest(optimizer: Any) -> str | None:
    if optimizer is None:
        return None
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
    return digest(opt.state_dict())


def scheduler_digest(scheduler: Any) -> str | None:
    return None if scheduler is None else digest(scheduler.state_dict())


HOST_RNG_STREAMS = ("python", "numpy", "torch_cpu")  # always digested; "cuda" only where CUDA is in use


def rng_digests() -> dict[str, str | None]:
    """Every RNG stream the Trainer checkpoints: the host ones (HOST_RNG_STREAMS) and cuda (None without CUDA)."""
    out = {
        "python": digest(list(random.getstate())),
        "numpy": digest(list(np.random.get_state())),
        "torch_cpu": digest(torch.get_rng_state()),
        "cuda": None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = digest(torch.cuda.get_rng_state_all())
    return out


def adapters_digest(model: torch.nn.Module) -> str | None:
    """Every PEFT adapter's weights, frozen ones included (with beta > 0, TRL keeps the reference policy as
    a frozen "ref" adapter next to the trained "default" one: restoring only one of them would go unseen
    by a trainable-parameters digest). None for a model without adapters."""
    if not hasattr(model, "peft_config"):
        return None
    return digest({n: p for n, p in model.named_parameters() if "lora_" in n or "modules_to_save" in n})


def state_digests(model, optimizer, scheduler) -> dict:
    return {
        "params": params_digest(model),
        "adapters": adapters_digest(model),
        "optimizer": optimizer_digest(optimizer),
        "scheduler": scheduler_digest(scheduler),
        "rng": rng_digests(),
    }
