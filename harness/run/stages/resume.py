"""The resume stage: the newest checkpoint that is complete and intact (torn or corrupted ones are skipped,
by name), what it recorded for each rank (frontier, counters), and the two resume fixes the stock Trainer
needs (full-weight strict load; the final-checkpoint shortcut)."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from harness.accounting import checkpoint as ckpt
from harness import dist
from harness.errors import RunDirStateError
from harness.faults import point
from harness.rundir import read_json

log = logging.getLogger("harness")


class CheckpointDamaged(Exception):
    """The deep check that `find` left to CheckAhead's thread found the chosen checkpoint damaged once the Trainer
    had begun loading it. Nothing was trained on it: the run goes back to `find` (harness.run.lifecycle), which now
    knows, skips it by name and resumes from the checkpoint before it, as it would have with the check done first."""

    def __init__(self, checkpoint: str, problems: list[str]):
        super().__init__(f"{checkpoint}: " + "; ".join(problems))
        self.checkpoint, self.problems = checkpoint, problems


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path | None = None  # None: a fresh start
    manifest: dict = field(default_factory=dict)  # its harness_checkpoint.json
    skipped: list = field(default_factory=list)  # [{"checkpoint", "problems"}] of newer, unusable ones
    # the files of `checkpoint` whose digests CheckAhead's thread had not taken when find chose it: checked by
    # confirm(), beside the Trainer's loads, before the first step; `check` (rank 0 only) is that CheckAhead
    unchecked: tuple = ()
    check: object = field(default=None, compare=False, repr=False)
    _confirmed: list = field(default_factory=list, compare=False, repr=False)

    def __getstate__(self) -> dict:  # broadcast to the other ranks: the thread stays on rank 0
        return {**self.__dict__, "check": None}

    def confirm(self, loaded=None) -> None:
        """The deep check of the chosen checkpoint, finished (every rank calls it, at the same point: the resume
        audit's start, after the Trainer's loads and before the first step; or before a paused run stops or a
        final checkpoint's weights load). Raises CheckpointDamaged when a file differs from its recorded digest.
        `loaded`: the state the Trainer loaded from it, as digests of its files' tensor ranges
        (harness.accounting.tensorfiles.loaded_state): the weights and optimizer state are not read again."""
        if not self.unchecked or self._confirmed:
            return
        self._confirmed.append(True)
        problems = self.check.problems(self.checkpoint, loaded) if dist.is_main() else None
        problems = dist.broadcast(problems)
        if problems:
            raise CheckpointDamaged(self.checkpoint.name, problems)

    def confirm_after(self, exc: BaseException) -> None:
        """The resume failed before its deep check was confirmed (a loader's error on a damaged file: a
        safetensors header, a torch.save zip): when the check finds the checkpoint damaged, that is what happened
        (CheckpointDamaged, and the run falls back); otherwise the loader's own error stands. One process only:
        with several ranks, the one that failed cannot know the others reach this point, so there `find` waits for
        the thread and leaves nothing unchecked."""
        if self.unchecked and not self._confirmed and not dist.is_multi() and not isinstance(exc, CheckpointDamaged):
            self.confirm()

    @property
    def permanent(self) -> bool:
        """The run's final checkpoint: training is over, only finalize remains."""
        return bool(self.manifest.get("permanent"))

    def frontier(self, rank: int) -> dict:
        """This rank's log frontiers at the checkpoint (ledger, trace, metrics), as JSON."""
        return self.manifest.get("frontier", {}).get(f"rank-{rank}", {})

    def stays_paused(self, stop_after: int | None) -> None:
        """budget.stop_after_steps=N (`stop_after`) with a resumable checkpoint at step >= N: the run stays paused,
        nothing runs (harness.halt.Halted "paused")."""
        step = self.manifest.get("step") if self.checkpoint is not None else None
        if stop_after is not None and step is not None and step >= stop_after and not self.permanent:
            from harness.halt import Halted

            self.confirm()  # paused at an intact checkpoint
            log.info("budget.stop_after_steps=%d: the run is at step %d already (%s); it stays paused. Run the same "
                     "command without budget.stop_after_steps to continue.", stop_after, step, self.checkpoint.name)
            raise Halted("paused", step, self.checkpoint.name)

    def totals(self, rank: int) -> dict:
        """This rank's counters recorded by the checkpoint (a single-process checkpoint has only `totals`)."""
        if not self.manifest:
            return {}
        per_rank = self.manifest.get("rank_totals") or {}
        return per_rank.get(f"rank-{rank}", self.manifest["totals"] if rank == 0 and not per_rank else {})


class _Stopped(Exception):
    pass


def _stamp(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def loaded_by_the_trainer(path: Path) -> bool:
    """A checkpoint file whose every tensor the Trainer loads into memory that the resume audit hashes: the weights
    (model.safetensors, or its shards) and the optimizer state. In one process their deep check is left to the
    audit's start, where the digests of the loaded tensors stand in for re-reading them (ResumePoint.confirm)."""
    name = Path(path).name
    return Path(path).parent.name.startswith("checkpoint-") and (
        name == "optimizer.pt" or (name.startswith("model") and name.endswith(".safetensors")))


class CheckAhead:
    """The resume's deep check, begun on a worker thread when the run starts, so that re-reading and hashing the
    newest checkpoint's files overlaps the data and model stages instead of following them.

    In one process the files the Trainer loads whole into the state the resume audit hashes (the weights, the
    optimizer state: gigabytes at real size) are not read here at all (`defers`): their digests are computed at the
    audit's start from the loaded tensors' digests, which the audit takes anyway (ResumePoint.confirm), so each byte
    is read once, by the Trainer's load, instead of twice side by side. A file found damaged there sends the run back
    to `find`, as below, and from then on every file is read (`defers` off: the fall-back decides exactly).
    With several ranks every file is read here: a damaged file must be found before any rank loads it.

    The thread walks the run's published checkpoints newest first, as `find` does, and takes the digest of each of
    their files until one checkpoint is intact (usually the newest alone). It decides nothing: `find` still checks
    every checkpoint, in order, on the main thread, and only takes a digest from here for a file that is as it was
    when hashed (the same size, modification and change times, inode; else it reads the file again). A failure on
    the thread is dropped: `find` then does that work itself and meets the error there.

    When `find` runs before the thread is done, it does not wait: it decides on every check but the digests not
    taken yet, and the chosen checkpoint's remaining digests are taken on, beside the Trainer's loads
    (ResumePoint.confirm, before the first step). `fault`: the harness.faults point the thread passes first (the
    fault tests' `defer`: the thread waits until the run needs its verdict)."""

    def __init__(self, run_dir: Path, fault: str | None = None, defers: bool | None = None):
        self._done: dict[tuple[str, str], tuple[tuple, str]] = {}
        self.defers = not dist.is_multi() if defers is None else defers  # leave loaded_by_the_trainer files to confirm
        self._stop = threading.Event()
        self._needed = threading.Event()  # set by the first caller that waits for the thread
        self._fault = fault
        self._thread = threading.Thread(target=self._walk, args=(Path(run_dir),), name="harness-check-ahead",
                                        daemon=True)  # never keeps a failed run's process alive
        self._thread.start()

    def _walk(self, run_dir: Path) -> None:
        try:
            if self._fault and point(self._fault) == "defer":
                self._needed.wait()
            for p in reversed(ckpt.list_checkpoints(run_dir)):
                if (p / ckpt.CHECKPOINT_MANIFEST).is_file() and not ckpt.checkpoint_problems(p, digest=self._take):
                    return
        except Exception as exc:  # noqa: BLE001 (find does this work again and reports what is wrong)
            log.debug("check ahead stopped: %r", exc)

    def _take(self, path: Path, algorithm: str) -> str | None:
        if self._stop.is_set():
            raise _Stopped
        return None if self.leaves(path) else self._read(path, algorithm)

    def _read(self, path: Path, algorithm: str) -> str:
        before = _stamp(path)
        value = ckpt.digest_on_disk(path, algorithm)
        if _stamp(path) == before:  # not changed while it was read
            self._done[str(path), algorithm] = (before, value)
        return value

    def leaves(self, path: Path) -> bool:
        """A file the thread does not read: its check is left to confirm (`defers`)."""
        return self.defers and loaded_by_the_trainer(path)

    def taken(self, path: Path, algorithm: str) -> str | None:
        """The digest taken ahead, if the file is as it was when hashed; None if not taken (yet). Does not wait."""
        hit = self._done.get((str(path), algorithm))
        return hit[1] if hit is not None and hit[0] == _stamp(path) else None

    def settled(self) -> bool:
        """The thread is done (or stopped): waiting for it costs nothing."""
        return not self._thread.is_alive()

    def digest(self, path: Path, algorithm: str) -> str:
        """A file's digest on disk: the one taken ahead where the file is unchanged since; waits for the thread."""
        self._needed.set()
        self._thread.join()
        return self.taken(path, algorithm) or self._read(path, algorithm)

    def problems(self, checkpoint: Path, loaded=None) -> list[str]:
        """The deep check of `checkpoint` (ResumePoint.confirm): the digests taken ahead, the others read now.
        `loaded` (path -> the digests of its tensor ranges in memory, or None): the files the Trainer loaded are
        digested from the loaded tensors and their other bytes (headers, the zip's records) read from the file.
        Where that finds a difference, every file is read: a damaged file, or a load that did not restore the
        bytes (the resume audit's to report)."""
        if loaded is not None:
            def from_memory(path: Path, algorithm: str) -> str:
                known = loaded(path) if algorithm == ckpt.ALGORITHM else None
                return ckpt.file_digest(path, known) if known is not None else self.digest(path, algorithm)

            if not ckpt.checkpoint_problems(checkpoint, digest=from_memory):
                return []
        problems = ckpt.checkpoint_problems(checkpoint, digest=self.digest)
        if problems:
            self.defers = False  # the fall-back decides on every file read (find, then nothing left to confirm)
        return problems

    def cancel(self) -> None:
        """The run ends before `find` (a failed data or model stage): stop after the file being hashed."""
        self._stop.set()
        self._needed.set()


def find(plan, run_dir: Path, ahead: CheckAhead | None = None) -> ResumePoint:
    """The checkpoint to resume from. An explicit `resume_from` must be that checkpoint: resuming from an
    older one would silently roll the run back (its later checkpoints, ledger rows and metrics orphaned).
    `ahead`: the file digests taken ahead, on a thread (CheckAhead). Where its thread is still hashing, find does
    not wait for it: a digest not taken yet is left to ResumePoint.confirm (`unchecked`), which the run calls
    after the Trainer's loads; a damaged checkpoint found then sends the run back here (CheckpointDamaged), and
    the decision ends the same as without the thread."""
    from harness.accounting.logs import Frontier, FrontierError, check_frontier

    from harness.rundir import MANIFEST

    ckpt.clean_removals(run_dir)
    identity = read_json(run_dir / MANIFEST)["identity"]
    unchecked: list[Path] = []  # of the checkpoint being checked

    def digest(path: Path, algorithm: str) -> str | None:
        if ahead is None:
            return ckpt.digest_on_disk(path, algorithm)
        if dist.is_multi():  # several ranks: exact (confirm_after), the thread waited for
            return ahead.digest(path, algorithm)
        got = ahead.taken(path, algorithm)
        if got is None and ahead.settled() and not ahead.leaves(path):
            got = ahead.digest(path, algorithm)  # nothing to wait for (a file changed since the thread read it)
        if got is None:
            unchecked.append(path)  # the thread's work yet, or the audit's (CheckAhead.defers)
        return got

    chosen, skipped = None, []
    for p in reversed(ckpt.list_checkpoints(run_dir)):
        unchecked.clear()
        problems = ckpt.checkpoint_problems(p, identity=identity, digest=digest)
        if not problems:
            try:
                for rank_frontier in read_json(p / ckpt.CHECKPOINT_MANIFEST)["frontier"].values():
                    for fr in rank_frontier.values():  # every rank's ledger, trace (and rank 0's metrics)
                        check_frontier(run_dir, Frontier.from_json(fr))
            except FrontierError as exc:
                problems = [f"{p.name}: {exc}"]
        if problems:
            log.warning("skipping checkpoint %s: %s", p.name, "; ".join(problems))
            skipped.append({"checkpoint": p.name, "problems": problems})
            continue
        chosen = p
        break
    if chosen is None:
        _check_nothing_damaged(run_dir, skipped)
    manifest = read_json(chosen / ckpt.CHECKPOINT_MANIFEST) if chosen else {}
    _check_ranks(chosen, manifest, run_dir)
    _check_explicit(plan.cfg.resume_from, chosen)
    if chosen is not None:
        later = "; the digests of its files are checked as it loads" if unchecked else ""
        log.info("resuming from %s (newest complete checkpoint%s)", chosen.name, later)
    rel = tuple(str(p.relative_to(chosen)) for p in unchecked) if chosen is not None else ()
    return ResumePoint(chosen, manifest, skipped, unchecked=rel, check=ahead if rel else None)


def _check_nothing_damaged(run_dir: Path, skipped: list[dict]) -> None:
    """No checkpoint is usable. When every one is torn (a crash in the first save), the run starts over as it
    would have anyway; when a published one is damaged, starting over would throw away the run's accounted
    work (its ledger, trace and metrics are cut to nothing): refuse and say what to do instead."""
    damaged = [s for s in skipped if (run_dir / ckpt.CHECKPOINTS_DIR / s["checkpoint"] / ckpt.CHECKPOINT_MANIFEST).is_file()]
    if damaged:
        raise RunDirStateError(
            f"no checkpoint of {run_dir} can be resumed, and {len(damaged)} published one(s) are damaged: "
            + "; ".join(p for s in damaged for p in s["problems"][:3]) + ".\n"
            f"    fix: restore the damaged files (`python -m harness.verify {run_dir}` lists them); or move "
            f"{run_dir / ckpt.CHECKPOINTS_DIR} aside to train this run from its start; or start a new run "
            "(another output_root)")


def _check_ranks(chosen: Path | None, manifest: dict, run_dir: Path) -> None:
    ranks = len(manifest.get("frontier", {}))
    if chosen is not None and ranks != dist.world_size():
        raise RunDirStateError(
            f"{chosen.name} of {run_dir} was written by {ranks} rank(s), this launch has {dist.world_size()}: "
            "each rank resumes its own ledger, RNG state and share of the token budget.\n"
            f"    fix: resume with {ranks} rank(s) in all (placement.num_processes={ranks} on one machine, or "
            f"placement.num_machines x placement.num_processes = {ranks}; the same placement), or start a new run "
            "(another output_root)")


def _check_explicit(explicit: str | None, chosen: Path | None) -> None:
    if explicit and (chosen is None or Path(explicit).resolve() != chosen.resolve()):
        raise RunDirStateError(
            f"resume_from={explicit} is not the newest complete checkpoint of this run "
            f"({chosen.name if chosen else 'there is none'}); resuming from it would silently roll the run back.\n"
            "    fix: drop resume_from (the run continues from its newest complete checkpoint), or start a new run "
            "(another output_root) from that checkpoint with arm.init=<its path>")


def audit_the_resume(resume: ResumePoint, trainer, model, ctx, *, full_tuning: bool) -> None:
    """On resume: the resume audit (harness.run.audit) proves every piece of restored state before the first step,
    and a full fine-tune (`full_tuning`) whose checkpoint names tensors the model does not is loaded strictly first.
    `ctx`: this rank's RunContext."""
    if resume.checkpoint is None:
        return
    from harness.run.audit import ResumeAuditCallback

    audit = ResumeAuditCallback(ctx.run_dir, resume.checkpoint, rank=ctx.rank, confirm=resume.confirm)
    audit.attach(trainer)
    # first of all at on_train_begin: a checkpoint found damaged there stops the start before any other
    # callback begins (a recorder, a watchdog) in the attempt the run then abandons
    trainer.callback_handler.callbacks.insert(0, audit)
    if full_tuning and not stock_resume() and needs_strict_load(model, resume.checkpoint):
        load_full_weights_strictly(model, resume.checkpoint)


def needs_strict_load(model, checkpoint: Path) -> bool:
    """Whether the Trainer's own load would miss weights: the checkpoint names a tensor the model's state_dict
    does not (Qwen-VL's on-disk names, below). Where every name is the model's, the stock load restores them all
    and a second, strict load would read the weights twice; the resume audit proves the restore either way."""
    from harness.accounting.filedigest import safetensors_keys

    index = checkpoint / "model.safetensors.index.json"
    try:
        if index.is_file():
            keys = set(read_json(index)["weight_map"])
        else:
            keys = safetensors_keys(checkpoint / "model.safetensors")
    except (OSError, ValueError, KeyError):
        return True  # not the layout the stock load reads: the strict load decides (and says what is wrong)
    return not keys <= set(model.state_dict())


def load_full_weights_strictly(model, checkpoint: Path) -> None:
    """The fix for the Qwen-VL full fine-tuning resume pitfall (docs/platform.md).

    Trainer._load_from_checkpoint loads the checkpoint's safetensors with strict=False under the
    on-disk key names (visual.*, model.layers.*) while the modules are model.visual.* /
    model.language_model.*: nothing loads, a warning is printed, and training continues from the
    init weights with the step-N optimizer. Loading through from_pretrained applies the key
    mapping; the tensors are then copied into the live model strictly (every key, every shape).
    """
    from harness.policy import _auto_model

    model.load_state_dict(_auto_model(str(checkpoint)).state_dict(), strict=True)


def load_final_weights(model, checkpoint: Path, tuning: str) -> None:
    """The weights (full, or the LoRA adapters and the reference adapter) of the run's final checkpoint."""
    if tuning == "full":
        load_full_weights_strictly(model, checkpoint)
        return
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(checkpoint / "adapter_model.safetensors"), adapter_name="default")
    if (checkpoint / "ref" / "adapter_model.safetensors").is_file() and "ref" in model.peft_config:
        set_peft_model_state_dict(model, load_file(checkpoint / "ref" / "adapter_model.safetensors"),
                                  adapter_name="ref")


def stock_resume() -> bool:
    """HARNESS_STOCK_RESUME=1 disables the harness's resume fixes: only for the tests that show the
    audit catching the stock loader's silent failures."""
    return os.environ.get("HARNESS_STOCK_RESUME") == "1"
