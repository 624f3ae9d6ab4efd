"""Benchmark: what the harness's checkpoints and resumes cost over the bare Trainer's, at real model size (issue 47).

    .venv/bin/python bench/checkpoint.py [--quick] [--rounds 3] [--tmp DIR]

One process, on CPU, per model size: a random-weight Qwen2 causal LM (transformers' own seeded init,
torch.manual_seed(0); every parameter trainable: full fine-tuning) in a plain transformers.Trainer (TRL's
GRPOTrainer._save_checkpoint only adds a model card) with the AdamW state of one step (seeded random grads,
optimizer and scheduler stepped, grads freed). Sizes, in the shapes of the hub's Qwen2.5 instruct models:

  0.5b   Qwen2.5-0.5B-Instruct (hidden 896, 24 layers, vocab 151936, tied): ~0.49 B params, float32
  1.5b   Qwen2.5-1.5B-Instruct (hidden 1536, 28 layers, tied): ~1.54 B params, bfloat16 (params and AdamW state);
         the largest Qwen2.5 shape a 24 GiB machine holds (3B's would need ~30 GiB)

Each round times two kinds of work, on each side, harness first in odd rounds and bare first in even ones:

  checkpoint  harness: harness_checkpoint() below: Trainer._save_checkpoint (inside
                       harness.accounting.tensorfiles.recording where that exists), then what
                       CheckpointCallback.on_save adds: state digests, publish (file digests + manifest),
                       retention (keep_last=1)
              bare:    Trainer._save_checkpoint alone (model, optimizer, scheduler, RNG, trainer state)
  resume      harness: harness_resume() below: CheckAhead (the deep check's thread) and the model build, then
                       harness.run.stages.resume.find (what the thread has not hashed by then is left to
                       ResumePoint.confirm), the strict full-weight load (tuning=full; only where
                       needs_strict_load says so, if resume.py has it), the Trainer's loads in its order, the
                       resume audit's start (ResumeAuditCallback.on_train_begin between the optimizer and the RNG
                       loads: the loaded tensors' digests, then the deep check's rest, ResumePoint.confirm, which
                       takes the weights' and optimizer's file digests from them) and finish
              bare:    Trainer._load_from_checkpoint, _load_optimizer_and_scheduler, _load_rng_state

A warm-up round (not counted) comes first. Each side resumes from the checkpoint it has just written; that
directory is deleted after its resume (not timed), so retention finds nothing to remove. gc.collect() and
os.sync() run before every timed region (none starts with another's dirty pages to write back). A resume reads
the files back from the page cache where they still are (warm, the harder case: the harness's hashing is then a
larger share); a cold resume, after the page cache is dropped (root only; a requeued job on another node), reads
them from the disk on each side. Run it on an idle machine (each round line ends with the 1-minute load average: ~1 is this process alone).

Prints per-round seconds and ratios (harness/bare), then per size: parameters, checkpoint bytes on disk, the
median seconds and GB/s of each side, the paired ratios (median over rounds of harness/bare of the same round:
this machine's speed drifts; a save's disk writeback varies by seconds), the harness side's median breakdown
with its additions to the Trainer's own save or loads (as a share of the bare median: the steadiest figure) and
the peak RSS so far (ru_maxrss: mmap'd checkpoint files count in it). Last, for the 0.5b size (the
acceptance figure): `checkpoint_ratio=<x>`, `cold_resume_ratio=<x>`, `resume_ratio=<x>` (warm) and
`ratio=<max of checkpoint and warm resume>`.
Goals (issue 47): both ratios <= 1.15 at >= 0.5 B parameters with full fine-tuning.
--quick: the 0.5b size only, 3 rounds (2-4 minutes); the full run adds the 1.5b size (~8 minutes; ~15 GiB
anonymous memory at its peak, when the optimizer state is reloaded over the live one).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:  # the harness's Recorder: each tensor's digest taken once, as the Trainer writes it (issue 47)
    from harness.accounting.tensorfiles import recording
except ImportError:  # a harness without one: the state and the files are hashed apart

    @contextlib.contextmanager
    def recording(root):
        yield None

QWEN25 = dict(vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768, num_key_value_heads=2)
SIZES = {  # name: (Qwen2Config shape, dtype name)
    "0.5b": (dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14), "float32"),
    "1.5b": (dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12), "bfloat16"),
}
# tests/unit/test_bench_checkpoint.py: every step of both sides, in seconds (a figure of it means nothing)
SHAPES = {**SIZES, "test": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  vocab_size=512), "float32")}
# what find reads of the plan: no explicit resume_from
PLAN = SimpleNamespace(cfg=SimpleNamespace(resume_from=None))
# what publish and find read of a run's identity (harness.rundir.identity_diffs): realistic shapes, fixed values
IDENTITY = {"config_sha256": "0" * 64, "semantic_sha256": "1" * 64, "data": {"sha256": "2" * 64},
            "model": {"sha256": "3" * 64}, "teacher": None, "code": {"sha256": "4" * 64}}
TOTALS = {"completion_tokens": 0, "completions": 0, "loss_tokens": 0, "stopped_by_budget": False, "nonfinite_steps": 0}


def _lap(laps: dict, name: str, t0: float) -> float:
    t = time.perf_counter()
    laps[name] = laps.get(name, 0.0) + t - t0
    return t


def harness_checkpoint(trainer, run_dir: Path, step: int) -> dict[str, float]:
    """The Trainer's save of checkpoint-<step>, then CheckpointCallback.on_save's additions as rank 0 of one
    process does them (harness/run/checkpoint_callback.py), with the digests a recorder took during the save where the
    harness has one. Returns the seconds of each part."""
    from harness.accounting import checkpoint as ckpt
    from harness.accounting import statedigest

    laps: dict[str, float] = {}
    trainer.state.global_step = step
    ckpt_dir = Path(trainer.args.output_dir) / f"checkpoint-{step}"
    t = time.perf_counter()
    with recording(trainer.args.output_dir) as rec:
        trainer._save_checkpoint(trainer.model, trial=None)
    t = _lap(laps, "trainer save", t)
    memo = {} if rec is None else {"memo": rec.memo}
    if rec is not None and hasattr(statedigest, "fill_memo"):  # as CheckpointCallback: optimizer state on threads
        statedigest.fill_memo([statedigest.optimizer_state(trainer.optimizer)], rec.memo)
    digests = statedigest.state_digests(trainer.model, trainer.optimizer, trainer.lr_scheduler, **memo)
    t = _lap(laps, "state digests", t)
    files = {} if rec is None else {"files": rec.checkpoint_files(
        ckpt_dir, {"optimizer.pt": statedigest.optimizer_state(trainer.optimizer)})}
    ckpt.publish(ckpt_dir, step=step, identity=IDENTITY, frontier={"rank-0": {}}, state={"rank-0": digests},
                 totals=TOTALS, permanent=False, kept=None, **files)  # no recorder: publish reads the files
    if rec is not None:
        rec.forget()
    t = _lap(laps, "publish", t)
    ckpt.apply_retention(run_dir, keep_last=1)
    _lap(laps, "retention", t)
    return laps


def bare_checkpoint(trainer, run_dir: Path, step: int) -> dict[str, float]:
    trainer.state.global_step = step
    trainer._save_checkpoint(trainer.model, trial=None)
    return {}


HELD: list = []  # the models a resume built: freed after its timed region (a resumed run keeps its model)


def build_policy(base: Path):
    """The resumed process's model, built from the base snapshot as the policy stage builds it (from_pretrained)."""
    from transformers import AutoModelForCausalLM

    HELD.append(AutoModelForCausalLM.from_pretrained(base, dtype="auto"))


def harness_resume(trainer, run_dir: Path, step: int, whole: bool = True) -> dict[str, float]:
    """What a resumed harness run does with its newest checkpoint, in its order (harness/run/recipe.py Run.setup:
    CheckAhead, the model stage, find; harness/run/stages/resume.py audit_the_resume with tuning=full, then
    Trainer.train's loads and the audit's callbacks). `whole=False`: from find on (no model build; the deep check not overlapped)."""
    from harness.run.audit import ResumeAuditCallback
    from harness.run.stages import resume

    laps: dict[str, float] = {}
    t = time.perf_counter()
    ahead = None
    if whole:
        ahead = resume.CheckAhead(run_dir) if hasattr(resume, "CheckAhead") else None
        build_policy(run_dir / "base")
        t = _lap(laps, "model build", t)
    # deep: files re-hashed (with CheckAhead, those its thread has not hashed yet are left to confirm, below)
    point = resume.find(PLAN, run_dir, *([ahead] if ahead else []))
    assert point.checkpoint is not None and point.checkpoint.name == f"checkpoint-{step}", point
    t = _lap(laps, "deep check", t)
    ckpt = point.checkpoint
    audit = ResumeAuditCallback(run_dir, ckpt, rank=0, confirm=getattr(point, "confirm", None))
    audit.attach(trainer)
    needs = getattr(resume, "needs_strict_load", None)
    if not resume.stock_resume() and (needs is None or needs(trainer.model, ckpt)):
        resume.load_full_weights_strictly(trainer.model, ckpt)
    t = _lap(laps, "strict load", t)
    trainer._load_from_checkpoint(str(ckpt))
    trainer._load_optimizer_and_scheduler(str(ckpt))
    t = _lap(laps, "trainer loads", t)
    audit.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model,
                         optimizer=trainer.optimizer, lr_scheduler=trainer.lr_scheduler)
    t = _lap(laps, "audit", t)
    trainer._load_rng_state(str(ckpt))  # wrapped by attach: + the audit's RNG digests (tiny)
    t = _lap(laps, "trainer loads", t)
    report = audit.finish(step)  # raises ResumeAuditError unless every component was restored as saved
    _lap(laps, "audit", t)
    assert report["status"] == "passed", report
    del trainer._load_rng_state, trainer._load_optimizer_and_scheduler  # attach's wrappers: the bare side loads unobserved
    return laps


def bare_resume(trainer, run_dir: Path, step: int, whole: bool = True) -> dict[str, float]:
    if whole:
        build_policy(run_dir / "base")
    ckpt = str(Path(trainer.args.output_dir) / f"checkpoint-{step}")
    trainer._load_from_checkpoint(ckpt)
    trainer._load_optimizer_and_scheduler(ckpt)
    trainer._load_rng_state(ckpt)
    return {}


LOADS = dict(whole=False)
SIDES = {"harness": (harness_checkpoint, harness_resume, harness_resume, functools.partial(harness_resume, **LOADS)),
         "bare": (bare_checkpoint, bare_resume, bare_resume, functools.partial(bare_resume, **LOADS))}
# resume: the model build from the base snapshot, then the checkpoint's loads (what the resumed process waits for);
# cold: the page cache dropped first (a requeued job on a new node); loads: from find on, no model build
WORKS = ("checkpoint", "resume", "cold resume", "loads")


def drop_page_cache() -> bool:
    """Write back and drop the page cache (root only): the next read comes from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def build(size: str, run_dir: Path):
    """A Trainer over a random-weight model of `size` with the AdamW state of one step; the run dir's manifest
    (the identity find reads)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Trainer, TrainingArguments

    from harness.accounting.checkpoint import CHECKPOINTS_DIR
    from harness.rundir import MANIFEST, atomic_write_json

    shape, dtype = SHAPES[size]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{**QWEN25, **shape}), dtype=getattr(torch, dtype))
    model.save_pretrained(run_dir / "base")  # what a resumed process builds its model from (build_policy)
    args = TrainingArguments(output_dir=str(run_dir / CHECKPOINTS_DIR), save_strategy="steps", report_to=[],
                             use_cpu=True, learning_rate=1e-5, disable_tqdm=True)
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype).mul_(1e-3)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    atomic_write_json(run_dir / MANIFEST, {"identity": IDENTITY})
    return trainer


def settle() -> None:
    """Before a timed region: no garbage to collect, no other region's dirty pages to write back."""
    HELD.clear()
    gc.collect()
    os.sync()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def bench_size(size: str, rounds: int, tmp: Path, works: tuple[str, ...] = WORKS) -> dict:
    """Time `rounds` rounds of both sides at `size`, of each of `works`; print the rounds and the summary; return
    the ratios."""
    run_dir = tmp / f"run-{size}"
    t0 = time.perf_counter()
    trainer = build(size, run_dir)
    params = sum(p.numel() for p in trainer.model.parameters())
    print(f"\n{size}: {params:,} parameters ({SHAPES[size][1]}), built in {time.perf_counter() - t0:.1f} s", flush=True)
    secs = {(s, w): [] for s in SIDES for w in works}
    parts = {w: [] for w in works}  # the harness side's laps, per round
    nbytes = 0
    # round 0 warms up, not counted: the first pass pays first-use costs (page cache, allocator) the others don't
    for r in range(rounds + 1):
        got = {}
        for side in SIDES if r % 2 else reversed(SIDES):  # harness first in odd rounds
            step = 2 * r + (side == "bare") + 1  # each save its own directory
            ckpt_dir = run_dir / "checkpoints" / f"checkpoint-{step}"
            for work, fn in zip(WORKS, SIDES[side]):
                if work not in works:
                    continue
                settle()
                if work == "cold resume" and not drop_page_cache():
                    got[side, work] = float("nan")
                    continue
                t = time.perf_counter()
                laps = fn(trainer, run_dir, step)
                got[side, work] = time.perf_counter() - t
                if side == "harness" and r:
                    parts[work].append(laps)
                elif side == "bare" and work == "checkpoint":
                    nbytes = dir_bytes(ckpt_dir)
            shutil.rmtree(ckpt_dir)
            shutil.rmtree(run_dir / "audits", ignore_errors=True)  # the resume audits' reports
        for key, s in got.items() if r else ():
            secs[key].append(s)
        print(f"{f'round {r}' if r else 'warm-up'}: " + "  ".join(
            f"{w} harness {got['harness', w]:6.2f} s bare {got['bare', w]:6.2f} s "
            f"(x{got['harness', w] / got['bare', w]:.3f})" for w in works)
              + f"  load {os.getloadavg()[0]:.1f}", flush=True)
    del trainer
    gc.collect()
    shutil.rmtree(run_dir)

    print(f"{size}: {params:,} parameters, checkpoint {nbytes / 1e9:.2f} GB on disk (the bare one; the harness "
          f"adds its manifest); {rounds} rounds")
    print(f"  {'work':10} {'harness':>9} {'GB/s':>6} {'bare':>9} {'GB/s':>6}  paired ratio (per round)")
    ratios = {}
    for w in works:
        if any(x != x for x in secs["harness", w]):  # nan: the page cache could not be dropped (not root)
            print(f"  {w}: not measured (dropping the page cache needs root)")
            continue
        h, b = statistics.median(secs["harness", w]), statistics.median(secs["bare", w])
        paired = [x / y for x, y in zip(secs["harness", w], secs["bare", w])]
        ratios[w] = statistics.median(paired)
        print(f"  {w:10} {h:7.2f} s {nbytes / 1e9 / h:6.2f} {b:7.2f} s {nbytes / 1e9 / b:6.2f}  {ratios[w]:.3f} ("
              + ", ".join(f"{x:.3f}" for x in paired) + ")")
        names = list(dict.fromkeys(k for laps in parts[w] for k in laps))
        # the harness's additions alone: free of the save's disk-bound noise (a recorder's hashing during the
        # save is in "trainer save", not here)
        own = {"checkpoint": ("trainer save",)}.get(w, ("trainer loads", "model build"))
        added = statistics.median(sum(v for k, v in laps.items() if k not in own) for laps in parts[w])
        print(f"  harness {w} breakdown (median s): "
              + ", ".join(f"{k} {statistics.median(laps.get(k, 0.0) for laps in parts[w]):.2f}" for k in names)
              + f"; all but the {' and '.join(own)}: {added:.2f} s = {added / b:.1%} of bare")
    print(f"  peak RSS so far {peak_rss_gib():.1f} GiB", flush=True)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the 0.5b size only, 3 rounds")
    ap.add_argument("--rounds", type=int, default=3, help="counted rounds (after one warm-up), also with --quick")
    ap.add_argument("--tmp", default=None, help="where the run dirs go (default: a temp dir; needs ~10 GB free)")
    args = ap.parse_args()
    sizes = ["0.5b"] if args.quick else list(SIZES)
    rounds = args.rounds

    import common
    import harness.run.audit  # noqa: F401  first imports are nobody's cost: not in round 1
    import harness.run.stages.resume  # noqa: F401
    import transformers
    from harness.accounting import checkpoint, statedigest  # noqa: F401

    common.quiet()
    transformers.logging.set_verbosity_error()
    recorder = recording.__module__ if recording.__module__ != __name__ else "none (state and files hashed apart)"
    print(f"{common.machine()}; harness {Path(harness.run.audit.__file__).parent}; recorder: {recorder}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-", dir=args.tmp) as tmp:
        results = {size: bench_size(size, rounds, Path(tmp)) for size in sizes}
    first = results["0.5b"]
    print(f"checkpoint_ratio={first['checkpoint']:.3f}")
    if "cold resume" in first:
        print(f"cold_resume_ratio={first['cold resume']:.3f}")
    print(f"resume_ratio={first['resume']:.3f}")
    print(f"loads_ratio={first['loads']:.3f}")
    print(f"ratio={max(first['checkpoint'], first['resume']):.3f}")


if __name__ == "__main__":
    main()
