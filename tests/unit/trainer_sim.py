"""A Trainer's step loop without a model, for unit tests of decisions that otherwise only a training run reaches.

The harness's callbacks (budget, halt, checkpoints) are driven by transformers' own CallbackHandler and
DefaultFlowCallback in the order Trainer.train drives them (step begin, sampling, step end, save, stop). Each step
that opens a generation round writes the ledger and trace rows HarnessReward writes, with token counts the test
chooses. The rank's RunContext comes from the recipe's own open_context (share, resume totals, frontiers).

Several ranks run as threads; the torch.distributed collectives the harness calls (all_reduce, all_gather_object,
broadcast_object_list, barrier) rendezvous between them (Ranks). A rank that enters a collective another rank has
stopped before never calling raises RanksDisagree at once: where a real launch would hang, the test fails.
"""

from __future__ import annotations

import copy
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch
import torch.distributed as tdist
from transformers import TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from harness import dist
from harness.run.callbacks import BudgetCallback, HaltCallback
from harness.run.context import RunContext
from harness.run.checkpoint_callback import CheckpointCallback
from harness.halt import Halt
from harness.run.stages.resume import ResumePoint
from harness.run.recipe import open_context

Tokens = Callable[[int, int, int], int]  # (rank, sampling step index, local completion index) -> sampled tokens


class RanksDisagree(AssertionError):
    """A rank entered a collective that another rank, which stopped earlier, never calls (a real launch hangs)."""


class Ranks:
    """`world` ranks of one launch as threads of this process (installed with monkeypatch: WORLD_SIZE, harness.dist's
    rank, and torch.distributed's collectives for world > 1; one rank keeps the real single-process paths)."""

    def __init__(self, world: int, monkeypatch):
        self.world = world
        self._cond = threading.Condition()
        self._local = threading.local()
        self._reset()
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setattr(dist, "rank", self.rank)
        if world > 1:
            monkeypatch.setattr(tdist, "is_initialized", lambda: True)
            monkeypatch.setattr(tdist, "get_world_size", lambda group=None: world)
            monkeypatch.setattr(tdist, "get_rank", lambda group=None: self.rank())
            monkeypatch.setattr(tdist, "all_reduce", self.all_reduce)
            monkeypatch.setattr(tdist, "all_gather_object", self.all_gather_object)
            monkeypatch.setattr(tdist, "broadcast_object_list", self.broadcast_object_list)
            monkeypatch.setattr(tdist, "barrier", self.barrier)

    def _reset(self) -> None:
        self._slots: dict[int, dict[int, object]] = {}
        self._calls = [0] * self.world
        self._left: set[int] = set()

    def rank(self) -> int:
        return getattr(self._local, "rank", 0)

    @contextmanager
    def as_rank(self, r: int):
        """This thread acts as rank `r` (e.g. open_context of one rank, outside a run)."""
        before = self.rank()
        self._local.rank = r
        try:
            yield
        finally:
            self._local.rank = before

    def run(self, fn: Callable[[int], object]) -> list:
        """fn(rank) on every rank at once, each in its own thread (one rank: in this thread, so that signal
        handlers can be installed); the results in rank order. The first error of a rank is raised, a root cause
        before the disagreement it caused on the other ranks."""
        self._reset()
        if self.world == 1:
            with self.as_rank(0):
                return [fn(0)]
        out, errors = [None] * self.world, [None] * self.world

        def body(r: int) -> None:
            self._local.rank = r
            try:
                out[r] = fn(r)
            except BaseException as exc:  # noqa: BLE001  (raised in the test's thread below)
                errors[r] = exc
            finally:
                with self._cond:
                    self._left.add(r)
                    self._cond.notify_all()

        threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}") for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [e for e in errors if e is not None]
        if failed:
            raise next((e for e in failed if not isinstance(e, RanksDisagree)), failed[0])
        return out

    def _exchange(self, kind: str, value) -> list:
        """Every rank's `value` of this collective (each rank's n-th call meets the others' n-th), in rank order."""
        r = self.rank()
        with self._cond:
            n = self._calls[r]
            self._calls[r] += 1
            self._slots.setdefault(n, {})[r] = (kind, value)
            self._cond.notify_all()
            while len(self._slots[n]) < self.world:
                gone = sorted(q for q in self._left if self._calls[q] <= n)
                if gone:
                    raise RanksDisagree(f"rank {r} waits in {kind} (collective #{n + 1}), which rank(s) {gone} "
                                        "stopped before calling (a real launch would hang here)")
                if not self._cond.wait(timeout=60):
                    raise RanksDisagree(f"rank {r}: {kind} (collective #{n + 1}) timed out")
            kinds = [self._slots[n][q][0] for q in range(self.world)]
            if len(set(kinds)) > 1:
                where = ", ".join(f"{k} on rank {q}" for q, k in enumerate(kinds))
                raise RanksDisagree(f"collective #{n + 1} is {where}: the ranks are at different points of training "
                                    "(a real launch would hang)")
            return [self._slots[n][q][1] for q in range(self.world)]

    def all_reduce(self, tensor, op=tdist.ReduceOp.SUM, group=None, async_op=False):
        values = torch.stack(self._exchange("all_reduce", tensor.detach().clone()))
        if op == tdist.ReduceOp.MIN:
            tensor.copy_(values.min(0).values)
        elif op == tdist.ReduceOp.MAX:
            tensor.copy_(values.max(0).values)
        elif op == tdist.ReduceOp.SUM:
            tensor.copy_(values.sum(0))
        else:
            raise NotImplementedError(op)

    def all_gather_object(self, out: list, obj, group=None) -> None:
        out[:] = [copy.deepcopy(v) for v in self._exchange("all_gather_object", obj)]  # (pickled in a real launch)

    def broadcast_object_list(self, box: list, src: int = 0, group=None, device=None) -> None:
        box[0] = copy.deepcopy(self._exchange("broadcast_object_list", box[0] if self.rank() == src else None)[src])

    def barrier(self, group=None, async_op=False, device_ids=None) -> None:
        self._exchange("barrier", None)


@dataclass
class RankRun:
    ctx: RunContext  # the rank's counters and (closed) logs after training
    steps: int  # global_step when its loop ended
    saved: list  # the steps at whose end a checkpoint was saved (published by rank 0)


def sample(ctx: RunContext, rank: int, step: int, tokens: Tokens, tag: str) -> None:
    """The rows HarnessReward writes for a step that opens a generation round (`step`: its 0-based index)."""
    rnd = ctx.round
    if not rnd.opens_round(step):
        return
    for j in range(rnd.local_completions):
        slot, gen = rnd.slot(rank, j)
        cid, n = f"{tag}:{step}:{slot}:{gen}", tokens(rank, step, j)
        assert 0 <= n <= rnd.max_completion_length, f"the test asked for {n} tokens in one completion"
        ctx.ledger.append({"completion_id": cid, "tokens": n, "terminated": n < rnd.max_completion_length,
                           "step": step, "view": f"view-{slot}"})
        ctx.trace.append({"completion_id": cid, "reward": 0.0, "parser_error": None, "step": step,
                          "truncated": n == rnd.max_completion_length})
        ctx.tokens_used += n
        ctx.completions += 1
    ctx.ledger.flush()
    ctx.trace.flush()


def train(plan, run_dir: Path, ranks: Ranks, tokens: Tokens, *, resume: ResumePoint | None = None,
          save_steps: int = 1000, keep_last: int = 2, stop_after: int | None = None,
          signals: dict[int, int] | None = None, killed_after: int | None = None,
          max_steps: int | None = None) -> list[RankRun]:
    """Train every rank of `plan` (RL) from `resume` (None: a fresh start) until the callbacks stop it.

    `signals`: {rank: step}: that rank receives SIGTERM during that (1-based) step. `killed_after`: the process
    dies (SIGKILL: nothing more is written) once that step and its save, if any, are done. `max_steps`: the
    Trainer's (default: budget.max_steps)."""
    resume = resume or ResumePoint()
    run_dir = Path(run_dir)
    model = torch.nn.Linear(2, 2)  # what the checkpoint's state digests read: one replica, the same on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tag = plan.identity["semantic_sha256"][:8]
    args = SimpleNamespace(output_dir=str(run_dir / "checkpoints"), logging_first_step=False,
                           logging_strategy=IntervalStrategy.NO, eval_strategy=IntervalStrategy.NO,
                           save_strategy=SaveStrategy.STEPS, eval_delay=0)

    def one_rank(r: int) -> RankRun:
        ctx = open_context(plan, run_dir, resume)
        halt = Halt()
        callbacks = [DefaultFlowCallback(), BudgetCallback(ctx), HaltCallback(ctx, halt, stop_after),
                     CheckpointCallback(ctx, keep_last=keep_last)]
        handler = CallbackHandler(callbacks, model, None, optimizer, None)
        state = TrainerState(max_steps=max_steps or plan.budget["max_steps"], save_steps=save_steps,
                             global_step=resume.manifest.get("step", 0), is_world_process_zero=r == 0,
                             is_local_process_zero=r == 0)
        control, saved = TrainerControl(), []
        try:
            while True:
                control = handler.on_step_begin(args, state, control)
                sample(ctx, r, state.global_step, tokens, tag)
                if (signals or {}).get(r) == state.global_step + 1:
                    halt._on_signal(signal.SIGTERM, None)  # the handler Halt installs, as the signal calls it
                state.global_step += 1
                control = handler.on_step_end(args, state, control)
                if control.should_save:  # Trainer._save_checkpoint: every rank writes its part, then on_save
                    ckpt = run_dir / "checkpoints" / f"checkpoint-{state.global_step}"
                    ckpt.mkdir(parents=True, exist_ok=True)
                    (ckpt / f"rng_state_{r}.json").write_text(f'{{"rank": {r}, "step": {state.global_step}}}\n')
                    control = handler.on_save(args, state, control)
                    saved.append(state.global_step)
                if control.should_training_stop or state.global_step == killed_after:
                    break
        finally:
            for lg in (ctx.ledger, ctx.trace, ctx.metrics):
                if lg is not None:
                    lg.close()
        return RankRun(ctx=ctx, steps=state.global_step, saved=saved)

    return ranks.run(one_rank)
