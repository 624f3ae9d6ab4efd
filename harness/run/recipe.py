"""The run of one plan in this process, as one object read top to bottom (the shape of torchtune's recipes):

    recipe = Run(plan, run, parent_s=..., dumps=...)
    try:
        recipe.setup()             # data, policy, resume point, context, eval before, loggers, trainer
        recipe.train()             # the trainer trains, from the resume point
        return recipe.finalize()   # final policy, eval after, model card, completion.json
    finally:
        recipe.cleanup()           # the loggers closed on failure, the resume's deep check stopped

The recipe holds the run's state (its data, policy, resume point, context, loggers and trainer) as attributes set
in `setup`, in the order they are built. What surrounds it, the prerequisites, claiming the run dir, recording a
failure and the exit codes, is harness.run.lifecycle's; each step is a stage of harness.run.stages.

One attempt at training is tied to its resume point. When the chosen checkpoint fails its deep check as it loads
(harness.run.stages.resume: the check finished beside the Trainer's loads, before the first step), `train` closes
that attempt, skips the checkpoint by name and sets up again from the one before it; nothing was trained on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time

from harness import dist
from harness.faults import point
from harness.rundir import RunDir, now
from harness.run.stages.resume import CheckAhead, CheckpointDamaged  # torch-free

log = logging.getLogger("harness")


class Run:
    """The run of `plan` in this process (every rank builds its own), in the run dir `run` (claimed by rank 0).
    `parent_s`: the seconds this process spent on the plan's prerequisites; `dumps`: the run's stack dumps
    (harness.diagnostics), whose hang watchdog training arms."""

    def __init__(self, plan, run: RunDir, *, parent_s: float = 0.0, dumps=None):
        self.plan, self.run, self.dumps = plan, run, dumps
        self._earlier_starts = list(run.manifest.get("start_phases", []))  # one entry per start (resumes too)
        self._this_start = {"pid": os.getpid(), "started_at": now(), "seconds": {}}
        self.clock = Phases(parent=parent_s, on_mark=self._record_start)  # the seconds of each phase
        self.started = time.time()
        self.ahead = None  # the resume's deep check, on a thread (harness.run.stages.resume.CheckAhead)
        self.data = self.policy = self.resume = self.ctx = self.trainer = self.halt = None
        self.evals: dict = {}
        self.logger_env: dict | None = None  # the logger environment before the run's loggers opened
        self.train_out = None

    # --- the recipe

    def setup(self) -> None:
        """What training needs, in the order it is built."""
        # the resume's deep check starts first, on a thread: beside the imports (torch, transformers, TRL: seconds),
        # the data and model stages and, where it is not done by then, the Trainer's loads
        self.ahead = CheckAhead(self.run.path, fault=f"{self.plan.kind}.check_ahead") if dist.is_main() else None
        self._import_training()
        self.data = self._prepare_data()
        self.policy = self._build_policy()
        self.run.set_status("running", init=self.policy.init)
        self._start_attempt()  # the resume point, the context, eval before, the loggers, the trainer

    def train(self) -> None:
        """The trainer trains from the resume point (or finishes from the final checkpoint), under the run's signal
        handlers. A planned stop (a signal, budget.stop_after_steps) raises harness.halt.Halted once its checkpoint is
        published; too many non-finite gradients raise NonFiniteError. When the chosen checkpoint fails its deep
        check as it loads (before the first step), the attempt is dropped and the next one starts from the
        checkpoint before it."""
        while True:
            try:
                return self._fit()
            except CheckpointDamaged as exc:
                self._drop_attempt(exc)
                self._start_attempt()

    def finalize(self) -> dict | None:
        """The final policy, the eval after training, the model card and completion.json (rank 0's content)."""
        from harness.run.stages.finalize import finalize
        from harness.run.stages.train import Trained

        trained = Trained(trainer=self.trainer, ctx=self.ctx, train_out=self.train_out, evals=self.evals)
        completion = finalize(self.plan, self.run, self.data, self.policy, trained, self.started, clock=self.clock)
        if completion is not None:
            self.run.set_status("completed")
        return completion

    def cleanup(self) -> None:
        """After the run, finished or failed: the loggers of an attempt that failed before it trained are closed,
        and the deep check's thread stops (a run that failed before its resume point was chosen)."""
        if self.logger_env is not None:
            self.close_loggers(failed=True)
        if self.ahead is not None:
            self.ahead.cancel()

    # --- the steps

    def _import_training(self) -> None:
        """torch, transformers and TRL: paid by the first run of a process."""
        from harness import policy  # noqa: F401  (what the phase measures)
        from harness.log import quiet_libraries
        from harness.run.stages import data, finalize, preflight, train  # noqa: F401

        point(f"{self.plan.kind}.start")  # tests only (harness.faults): a crash right after the claim
        quiet_libraries()
        _reset_peak_memory()  # completion.json's peak_cuda_mb is this run's, not the process's (a sweep's jobs)
        self.clock.lap("imports")

    def _prepare_data(self):
        """The dataset: prepared (rank 0 builds the caches), validated, bound to the run's recorded digest."""
        from harness.run.stages import data as data_stage

        plan, run = self.plan, self.run
        data = dist.main_first(data_stage.prepare, plan.cfg, run.recorded("data"), run_dir=str(run.path),
                               fix="restore the dataset, or start a new run (another output_root)")
        run.update(identity={"data": {"content_sha256": data.content_sha256, "root": str(data.root)}})
        log.info("data: %s (%s)", data.root, data.summary)
        data = data_stage.load_rows(plan.cfg, data)
        self.clock.lap("data")
        return data

    def _build_policy(self):
        """The policy: base model, init, tuning and device, bound to the run's recorded model; the preflight (every
        prompt's tokens against the context) once the processor exists."""
        from harness.policy import build_policy
        from harness.run.stages import preflight
        from harness.data.trainsets import corpus

        plan, run, data = self.plan, self.run, self.data
        policy = build_policy(plan, run.recorded("model"), corpus(data.train_rows + data.test_rows),
                                    str(run.path), preflight=functools.partial(preflight.run, plan, run, data))
        self.clock.lap("model")
        parent = plan.parent and {"run_name": plan.parent.run_name, "run_dir": plan.parent.run_dir,
                                  "semantic_sha256": plan.parent.identity["semantic_sha256"]}
        run.update(identity={"model": {"files_sha256": policy.base_identity.get("files_sha256"),
                                       "base_path": policy.base_path}}, parent=parent)  # a parent iff init=sft
        return policy

    def _setup_from_resume_point(self) -> None:
        """One attempt's state, from its resume point: the context, the eval before, the loggers, the trainer."""
        from harness.eval.during import eval_before
        from harness.halt import Halt
        from harness.run.loggers import open_run_loggers
        from harness.run.stages.resume import audit_the_resume, find
        from harness.run.stages.train import build

        plan, path = self.plan, self.run.path
        self.resume = dist.on_main(find, plan, path, self.ahead)  # one decision for all ranks
        if self.resume.skipped:
            self.run.update(skipped_checkpoints=[*self.run.manifest.get("skipped_checkpoints", []),
                                                 *self.resume.skipped])
        with self._damage_explained():
            self.resume.stays_paused(plan.cfg.budget.stop_after_steps)  # reached already: nothing runs
            self.ctx = open_context(plan, path, self.resume)  # this rank's logs at the frontier, its counters
            self.evals = eval_before(plan, path, self.data, self.policy, resumed=self.resume.checkpoint is not None)
            self.clock.lap("eval_before")
            self.logger_env = open_run_loggers(plan, path)  # W&B / trackio (rank 0)
            self.halt = Halt()  # this process's stop request, read after every step
            self.trainer = build(plan, path, self.data, self.policy, self.ctx, self.resume, halt=self.halt,
                                 dumps=self.dumps, clock=self.clock)
            audit_the_resume(self.resume, self.trainer, self.policy.model, self.ctx,  # the state, proven
                             full_tuning=plan.cfg.model.tuning == "full")

    def _fit(self) -> None:
        """trainer.train() under the run's signal handlers (or, from the run's final checkpoint, its weights
        restored for finalize); every rank's logs closed and the loggers too, also on failure."""
        from harness.halt import Halted
        from harness.run.stages.train import finish_from_final_checkpoint, nonfinite_error

        plan, resume, ctx = self.plan, self.resume, self.ctx
        failed = True
        try:
            with self._damage_explained():
                if resume.permanent:
                    self.train_out = finish_from_final_checkpoint(plan, self.trainer, self.policy.model, resume, ctx)
                else:
                    with self.halt:  # SIGTERM / SIGINT (/ a scheduler's signal) stop after the current step
                        checkpoint = str(resume.checkpoint) if resume.checkpoint else None
                        self.train_out = self.trainer.train(resume_from_checkpoint=checkpoint)
            failed = False
        finally:  # also on failure: the next job of a sweep (same process) must not inherit open loggers
            self.close_loggers(failed=failed)
        dist.barrier()  # every rank's ledger and trace are closed (fsynced) before rank 0 reads them
        self.clock.lap("train")
        if ctx.nonfinite_abort is not None:
            raise nonfinite_error(plan, self.run.path, ctx)
        if ctx.halted:
            h = ctx.halted
            raise Halted(h["status"], h["step"], f"checkpoint-{h['step']}", signum=h["signum"],
                         then=self.halt.scheduler_handler())

    def close_loggers(self, *, failed: bool) -> None:
        """Close this attempt's logs and writers and restore the logger environment (harness.run.loggers)."""
        from harness.run.loggers import close_loggers

        env, self.logger_env = self.logger_env, None
        if self.trainer is not None:
            close_loggers(self.trainer, self.ctx, env, failed=failed)

    def _start_attempt(self) -> None:
        """An attempt from a resume point (_setup_from_resume_point); a checkpoint found damaged already there (a
        paused run's, or a loader's error the deep check explains) is dropped and the next one tried."""
        while True:
            try:
                return self._setup_from_resume_point()
            except CheckpointDamaged as exc:
                self._drop_attempt(exc)

    def _drop_attempt(self, exc) -> None:
        """The chosen checkpoint failed its deep check as it loaded: nothing was trained on it; find now knows and
        skips it by name (twice at most: once confirm has run, find is exact)."""
        log.warning("%s failed its deep check as it loaded (%s); choosing again", exc.checkpoint,
                    "; ".join(exc.problems[:3]))
        if self.logger_env is not None:
            self.close_loggers(failed=True)
        self.trainer = None

    @contextlib.contextmanager
    def _damage_explained(self):
        """A failure while the chosen checkpoint loads that its damage explains becomes CheckpointDamaged
        (ResumePoint.confirm_after: a loader's error on a garbled file); any other error stands."""
        try:
            yield
        except Exception as exc:
            if self.resume is not None:
                self.resume.confirm_after(exc)
            raise

    def _record_start(self, marks: dict) -> None:
        self.run.update(start_phases=[*self._earlier_starts, {**self._this_start, "seconds": marks}])


def open_context(plan, run_dir, resume):
    """This rank's RunContext (harness.run.context), built here only: metrics (rank 0), the kind's logs (RL: ledger
    and trace) reopened at the resume point's frontier, and the counters its checkpoint recorded (no need to re-read
    the ledger)."""
    from harness.accounting.logs import METRICS_PATH, AppendLog, Frontier
    from harness.run.context import RunContext
    from harness.run.stages.kind import kind_run

    rank, world = dist.rank(), dist.world_size()
    fr = resume.frontier(rank)
    opened = lambda key, rel: AppendLog(run_dir, rel, Frontier.from_json(fr[key]) if key in fr else None)  # noqa: E731
    totals = resume.manifest.get("totals") or {}
    return RunContext(run_dir=run_dir, plan=plan, rank=rank, world=world,
                      metrics=opened("metrics", METRICS_PATH) if dist.is_main() else None,
                      nonfinite_steps=totals.get("nonfinite_steps", 0),
                      # the run's final checkpoint: training is over, and its end is as the checkpoint recorded it
                      stopped_by_budget=bool(resume.permanent and totals.get("stopped_by_budget")),
                      # RL: ledger and trace at the frontier, the token counters, the learning-signal monitor
                      **kind_run(plan.kind).open_logs(plan, run_dir, rank, world, resume, opened))


def _reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


class Phases:
    """Wall seconds per phase of a run, in order: `lap(name)` closes the phase that ends now. Also the start
    phases: `start[name]`, the seconds from this process's start on the plan (its parent included) to the end of
    each phase and to the first optimizer step (`mark("first_step")`), given to `on_mark` as they happen (the
    manifest's `start_phases`: the cold-start cost of every start of a run, resumes included)."""

    ORDER = ("parent", "imports", "data", "model", "eval_before", "train", "eval_after", "finalize")

    def __init__(self, parent: float = 0.0, on_mark=None):
        self.seconds = {"parent": round(parent, 3)}
        self.start = {"parent": round(parent, 3)}
        self._parent, self.on_mark = parent, on_mark
        self._t0 = self._t = time.perf_counter()

    def lap(self, name: str, mark: bool = True) -> None:
        """`mark=False`: a phase that goes on later (the start phase is marked at its last lap)."""
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._t, 3)
        self._t = now
        if mark:
            self.mark(name)

    def mark(self, name: str) -> None:
        self.start[name] = round(self._parent + time.perf_counter() - self._t0, 3)
        if self.on_mark is not None:
            self.on_mark(dict(self.start))

    def as_dict(self) -> dict:
        return {k: self.seconds.get(k, 0.0) for k in self.ORDER}
