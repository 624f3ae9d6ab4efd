"""Resume audit: prove that a resumed process restored every piece of training state.

At save time each checkpoint's harness_checkpoint.json records digests of the trainable
parameters, optimizer state, scheduler state and every RNG stream (harness.accounting.statedigest). When a
run resumes, the Trainer restores them in the new process; this callback recomputes the digests
at the moment each piece is restored and compares:

    parameters, adapters, optimizer,   on_train_begin (the Trainer loaded them just before; adapters:
    scheduler                          every PEFT adapter, the frozen reference one included)
    RNG streams                        right after Trainer._load_rng_state (it runs inside the
                                       epoch loop, after the dataloader is rebuilt)

and writes audits/resume-<n>-rank-<r>.json (status passed | failed, expected and actual digest
of each component) before the first step. A failed audit stops the run with ResumeAuditError.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from transformers import TrainerCallback

from harness.errors import HarnessError
from harness.rundir import atomic_write_json, now, read_json

log = logging.getLogger("harness")


class ResumeAuditError(HarnessError):
    exit_code = 6


@contextlib.contextmanager
def _storages_hashed_as_loaded(pipeline, path: Path):
    """While the Trainer loads `path` (optimizer.pt) with torch.load(..., map_location="cpu"), each storage is handed
    to `pipeline` as torch.load reads it: torch's own hook for that, a callable map_location, called once per
    storage on its first deserialization (on the CPU); it returns the storage, which is what "cpu" does. Any other
    file, or another map_location (a multi-GPU load onto the device), loads as called. NOTE(transformers-5.24):
    Trainer._load_optimizer_and_scheduler calls torch.load through the module attribute; tests/unit/
    test_transformers_contract.py pins the call."""
    import torch

    from harness.accounting.statedigest import storage_bytes

    real = torch.load

    def locate(storage, location):
        pipeline.add(storage_bytes(storage))
        return storage

    def load(f, map_location=None, *args, **kwargs):
        mine = isinstance(f, (str, os.PathLike)) and Path(f) == path and str(map_location) == "cpu"
        return real(f, locate if mine else map_location, *args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = real


class ResumeAuditCallback(TrainerCallback):
    def __init__(self, run_dir: Path, checkpoint: Path, rank: int = 0, confirm=None):
        """`confirm`: the resume's deep check finished (ResumePoint.confirm), once the Trainer's loads are done and
        the loaded tensors hashed: it takes their digests for the files they came from, and raises when a file of
        the checkpoint is damaged, before any component is compared."""
        self.run_dir, self.checkpoint, self.rank = Path(run_dir), Path(checkpoint), rank
        self.confirm = confirm
        self.memo: dict = {}  # each tensor's digest, taken once (statedigest.fill_memo)
        self._hashing = None  # the thread hashing the loaded state while the optimizer state loads (Pipeline)
        manifest = read_json(self.checkpoint / "harness_checkpoint.json")
        self.expected = manifest["state_digests"][f"rank-{rank}"]
        self.fmt = manifest.get("digests", 1)  # recomputed in the checkpoint's own digest format (statedigest)
        self.actual: dict = {}
        self.done = False

    def attach(self, trainer) -> None:
        """Observe the RNG restore, and hash the loaded weights while the optimizer state loads. NOTE(trl-1.16):
        wraps transformers' private Trainer._load_rng_state (the only place RNG streams are restored) and
        Trainer._load_optimizer_and_scheduler (called after the weights load); tests/unit/
        test_transformers_contract.py pins their signatures and order."""
        original = trainer._load_rng_state

        def load_rng_state_and_observe(checkpoint):
            original(checkpoint)
            if checkpoint is not None and "rng" not in self.actual:
                from harness.accounting.statedigest import rng_digests

                self.actual["rng"] = rng_digests(self.fmt)

        trainer._load_rng_state = load_rng_state_and_observe
        load_optimizer = trainer._load_optimizer_and_scheduler

        def load_optimizer_and_hash(checkpoint):
            # the Trainer has loaded the weights: they are hashed on a thread while the optimizer state loads (it
            # reads no parameter and writes none), then each optimizer storage as torch.load reads it; the
            # hashing overlaps the load, and on_train_begin waits for it
            trained = [p for p in trainer.model.parameters() if p.requires_grad]
            if checkpoint is None or self.fmt < 2 or self._hashing is not None or any(
                    p.device.type != "cpu" for p in trained):  # on a GPU the state is hashed from the device, after
                return load_optimizer(checkpoint)
            from harness.accounting.statedigest import Pipeline

            self._hashing = Pipeline(self.memo)
            for p in trained:
                self._hashing.add(p.detach())
            try:
                with _storages_hashed_as_loaded(self._hashing, Path(checkpoint) / "optimizer.pt"):
                    return load_optimizer(checkpoint)
            finally:
                self._hashing.end()

        trainer._load_optimizer_and_scheduler = load_optimizer_and_hash

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        from harness.accounting.statedigest import (adapters_digest, fill_memo, optimizer_digest, optimizer_state,
                                                    params_digest, scheduler_digest)

        if self._hashing is not None:
            self._hashing.join()  # what it could not hash is left to the walk below: the same digests
        memo = self.memo  # a tensor shared by two of them is hashed once
        if self.fmt >= 2:  # format 2 hashes each tensor apart: the large ones side by side on threads first
            fill_memo([[p for p in model.parameters() if p.requires_grad], optimizer_state(optimizer)], memo)
        if self.confirm is not None:  # the deep check's rest, the loaded tensors' digests standing in for their files
            from harness.accounting.tensorfiles import loaded_state

            self.confirm(loaded_state(model, optimizer, memo) if self.fmt >= 2 else None)
        self.actual.update(params=params_digest(model, self.fmt, memo), adapters=adapters_digest(model, self.fmt, memo),
                           optimizer=optimizer_digest(optimizer, self.fmt, memo),
                           scheduler=scheduler_digest(lr_scheduler, self.fmt))
        if self._hashing is not None:
            self._hashing.release()
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.done:
            self.done = True
            self.finish(state.global_step)
        return control

    def finish(self, step: int, only: tuple[str, ...] | None = None) -> dict:
        """Compare and write the audit; `only` restricts it (a run resumed at its final checkpoint restores
        just the weights: there is no further step for an optimizer or RNG state to affect)."""
        components = {}
        for key in only or ("params", "adapters", "optimizer", "scheduler"):
            if key == "adapters" and self.expected.get(key) is None and self.actual.get(key) is None:
                continue  # no PEFT adapters on either side
            components[key] = {"expected": self.expected.get(key), "actual": self.actual.get(key),
                               "passed": self.expected.get(key) == self.actual.get(key)}
        if only is None:
            from harness.accounting.statedigest import HOST_RNG_STREAMS

            expected_rng, actual_rng = self.expected.get("rng") or {}, self.actual.get("rng") or {}
            # every stream either side knows, and always the host ones: a checkpoint that recorded no RNG digests
            # (or the restore never observed) fails by name instead of passing with nothing compared
            for stream in sorted({*HOST_RNG_STREAMS, *expected_rng, *actual_rng}):
                digest, got = expected_rng.get(stream), actual_rng.get(stream)
                if stream not in HOST_RNG_STREAMS and digest is None and got is None:
                    continue  # e.g. cuda: no CUDA on either side
                components[f"rng.{stream}"] = {"expected": digest, "actual": got,
                                               "passed": digest is not None and digest == got}
        passed = all(c["passed"] for c in components.values())
        audits = self.run_dir / "audits"
        n = len(list(audits.glob(f"resume-*-rank-{self.rank}.json"))) + 1 if audits.is_dir() else 1
        report = {"status": "passed" if passed else "failed", "checkpoint": self.checkpoint.name,
                  "resumed_at_step": step, "rank": self.rank, "at": now(), "components": components}
        path = audits / f"resume-{n}-rank-{self.rank}.json"
        atomic_write_json(path, report)
        if not passed:
            bad = [k for k, c in components.items() if not c["passed"]]
            raise ResumeAuditError(
                f"resume audit failed for {self.checkpoint.name}: {', '.join(bad)} not restored as saved "
                f"(see {path}). The run stopped before any further step, so nothing was trained on the wrong "
                "state.\n    fix: unset HARNESS_STOCK_RESUME if it is set; otherwise this model type's checkpoints do "
                "not load back through the Trainer: report it with the audit file")
        log.info("resume audit passed: %s restored (%s)", self.checkpoint.name, ", ".join(components))
        return report
