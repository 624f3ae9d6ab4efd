"""What the GPU check's child processes run that is not a harness command (bench/gpu_check.py starts them):

    python bench/gpu_check_child.py env WORK_DIR cuda|cpu                   versions, the GPU, free disk
    python bench/gpu_check_child.py build OUT SHAPE DEVICE DTYPE NEED_GB FAMILY...   hub-layout checkpoints, timed
    python bench/gpu_check_child.py trials SPEC.json RESULTS.jsonl          harness runs and a bare TRL trial

env and build print one `GPU_CHECK_RESULT {json}` line. trials: SPEC.json is {"jobs": [{"name": "grpo-lora",
"kind": "harness" | "bare", "overrides": [...], "cleanup": true}, ...]}; one JSON line per finished job goes to
RESULTS.jsonl as soon as it finishes, so a part cut by its timeout still leaves the jobs it finished. Exit 0
when every job passed, 1 otherwise.

Why the trials run in one process: each process pays 10-13 s of imports on the GPU node, and the bare trial
should run warm, as the harness runs before it did. Why hooks: a run started through the CLI only leaves TRL's
`step_time` (no optimizer update, logging or saves) and its files' times; here the same four transformers hooks
time both the harness and the bare trainer (step: on_step_begin to the end of on_step_end; checkpoint save:
_save_checkpoint to the end of on_save, the harness's digests and manifest included), so their ratio compares
like with like.

The bare trial is bench/common.py's, adapted: bench/common.bare_trial starts from the plan's SFT parent and
builds its BuildContext without a device (so TrainingArguments get use_cpu=True and no bf16 on a GPU); here the
policy is the plan's own base checkpoint (arm.init=scratch), moved to the plan's device, with the LoRA of the
plan, and the rows past the tokenizer suppressed as the harness does.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check_figures as figs  # noqa: E402

RESULT = "GPU_CHECK_RESULT "  # the line bench/gpu_check_parts.py reads a child's figures from
TIMES: dict[str, list[float]] = {}


def install_timers() -> None:
    """Record perf_counter stamps at the Trainer's step and save boundaries (both trainers go through these)."""
    from transformers import Trainer
    from transformers.trainer_callback import CallbackHandler

    def stamp(key):
        TIMES.setdefault(key, []).append(time.perf_counter())

    def before(cls, name, key):
        orig = getattr(cls, name)

        def wrapper(*a, **kw):
            stamp(key)
            return orig(*a, **kw)
        setattr(cls, name, wrapper)

    def after(cls, name, key):
        orig = getattr(cls, name)

        def wrapper(*a, **kw):
            out = orig(*a, **kw)
            stamp(key)
            return out
        setattr(cls, name, wrapper)

    before(CallbackHandler, "on_step_begin", "step_begin")
    after(CallbackHandler, "on_step_end", "step_end")
    before(Trainer, "_save_checkpoint", "save_begin")
    after(CallbackHandler, "on_save", "save_end")


def timed_figures() -> dict:
    steps = figs.intervals(TIMES.get("step_begin", []), TIMES.get("step_end", []))
    return {"wall_step_s": steps, "wall_s_per_step": figs.median_after_first(steps),
            "checkpoint_save_s": figs.intervals(TIMES.get("save_begin", []), TIMES.get("save_end", []))}


def harness_job(job: dict) -> dict:
    from harness.cli import compose_plan, run_plan

    plan = compose_plan(job["overrides"])
    run_dir = Path(plan.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    try:
        code = run_plan(plan)
        out = {"exit_code": code, **figs.run_figures(run_dir), **timed_figures()}
        ledger = figs.read_jsonl(run_dir / "ledgers" / "rank-0.jsonl")
    finally:
        if job.get("cleanup", True):  # a full 3B run leaves ~30 GB, failed or not: the next one needs the disk
            shutil.rmtree(run_dir, ignore_errors=True)
    by_step: dict[int, int] = {}
    for r in ledger:  # a ledger row's step is the 0-based optimizer step its generation round started at
        by_step[r["step"] + 1] = by_step.get(r["step"] + 1, 0) + r["tokens"]
    step_tokens = [by_step.get(k, 0) for k in range(1, len(out["wall_step_s"]) + 1)]
    out.update(completion_tokens=[r["tokens"] for r in ledger], sampled_tokens=sum(by_step.values()),
               step_tokens=step_tokens, wall_tokens_per_s=figs.tokens_per_s(step_tokens, out["wall_step_s"]))
    out["ok"] = code == 0 and out.get("verify") == "ok" and bool(out.get("step_time_s"))
    return out


def bare_job(job: dict, scratch: Path) -> dict:
    """A bare GRPOTrainer on the plan's base checkpoint, data and GRPOConfig for budget.max_steps steps."""
    import common  # bench/common.py: the bare reward function every race against TRL uses
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from arms.common import BuildContext
    from arms.grpo.trainer import grpo_config_kwargs
    from harness.cli import compose_plan
    from harness.data import load_split
    from harness.models import special_token_ids_to_suppress
    from harness.policy import (apply_tuning, build_base, device_of, eos_token_ids, load_policy,
                                rows_past_the_tokenizer)
    from harness.run.stages.data import dataset_root
    from harness.data.trainsets import rl_dataset

    plan = compose_plan(job["overrides"])
    cfg, device = plan.cfg, device_of(plan)
    if cfg.arm.name != "grpo" or cfg.arm.init != "scratch":
        raise ValueError("the bare trial is a GRPOTrainer from the base checkpoint: arm=grpo arm.init=scratch")
    out_dir = scratch / job["name"]
    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.perf_counter()
    base_path, _ = build_base(plan, [])
    model, processor = load_policy(base_path, base_path=base_path, model_cfg=cfg.model)
    model = apply_tuning(model, plan).to(device)
    root = dataset_root(cfg, plan.identity["data"])
    dataset = rl_dataset(root, load_split(root, cfg.data.train_split), is_vlm=cfg.model.is_vlm)
    tokens: list[int] = []
    reward = common.bare_reward(plan, eos_token_ids(processor, model), tokens)
    ctx = BuildContext(plan=plan, run_dir=out_dir, model=model, processor=processor, train_dataset=dataset,
                       suppress_token_ids=special_token_ids_to_suppress(processor)
                       + rows_past_the_tokenizer(model, processor), device=device)
    kw = grpo_config_kwargs(ctx)
    kw.update(disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(**kw), train_dataset=dataset,
                          processing_class=processor)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    t1 = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    train_s = time.perf_counter() - t1
    step_times = [round(r["step_time"], 3) for r in trainer.state.log_history if "step_time" in r]
    n_steps = trainer.state.global_step
    del trainer, model
    per = cfg.arm.prompts_per_step * cfg.arm.num_generations  # completions per optimizer step
    step_tokens = [sum(tokens[i * per:(i + 1) * per]) for i in range(n_steps)]
    wall = timed_figures()
    return {"ok": n_steps == cfg.budget.max_steps, "optimizer_steps": n_steps, "wall_s": round(time.perf_counter()
            - t0, 2), "train_s": round(train_s, 2), "step_time_s": step_times,
            "step_s": figs.median_after_first(step_times), "sampled_tokens": sum(tokens), "completion_tokens": tokens,
            "step_tokens": step_tokens, "wall_tokens_per_s": figs.tokens_per_s(step_tokens, wall["wall_step_s"]),
            **wall}


def env(work: str, device: str) -> int:
    import importlib.util

    import torch

    def version(m):
        return getattr(__import__(m), "__version__", "?") if importlib.util.find_spec(m) else None

    d = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
         "cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
         "free_disk_gb": round(shutil.disk_usage(work).free / 1e9, 1),
         **{m: version(m) for m in ("transformers", "trl", "peft", "accelerate", "torchvision", "hydra")}}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count())
    print(RESULT + json.dumps(d), flush=True)
    return 0 if torch.cuda.is_available() or device == "cpu" else 3


def build(out: str, shape: str, device: str, dtype: str, need_gb: str, *families: str) -> int:
    """Each family's checkpoint into OUT/<family> (replaced), timed; refused up front without NEED_GB free."""
    from harness.models.snapshot import build_snapshot

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for fam in families:
        shutil.rmtree(out_dir / fam, ignore_errors=True)
    free = shutil.disk_usage(out_dir).free / 1e9
    if free < float(need_gb):
        print(f"gpu_check: {out_dir} has {free:.0f} GB free; the 3B part needs {float(need_gb):.0f} GB (the snapshot "
              f"and a full run's checkpoint)\n    fix: --work DIR on a disk with more room", file=sys.stderr)
        return 2
    res = {}
    for fam in families:
        t0 = time.perf_counter()
        build_snapshot(out_dir / fam, family=fam, shape=shape, device=device, dtype=dtype)
        size = sum(p.stat().st_size for p in (out_dir / fam).rglob("*") if p.is_file())
        res[fam] = {"build_s": round(time.perf_counter() - t0, 2), "size_gb": round(size / 1e9, 3)}
    print(RESULT + json.dumps(res), flush=True)
    return 0


def trials(spec_path: str, results_path: str) -> int:
    spec, results = json.loads(Path(spec_path).read_text()), Path(results_path)
    results.unlink(missing_ok=True)
    t0 = time.perf_counter()
    import peft  # noqa: F401  (every heavy import before the go file: the check starts this process ahead)
    import torch
    import trl  # noqa: F401

    import arms.grpo.trainer  # noqa: F401
    import harness.run.lifecycle  # noqa: F401

    go, parent = os.environ.get("GPU_CHECK_GO"), os.getppid()
    if go:
        print(f"[trial] imports done in {time.perf_counter() - t0:.1f} s; waiting for the go file {go}", flush=True)
        while not Path(go).exists():
            if os.getppid() != parent:  # the check died without stopping this process: nobody will say go
                print("[trial] the check that started this process is gone; exiting", flush=True)
                return 3
            time.sleep(0.2)

    from harness.log import quiet_libraries, setup_logging

    setup_logging()
    quiet_libraries()
    install_timers()
    cuda = torch.cuda.is_available()
    failed = 0
    for job in spec["jobs"]:
        TIMES.clear()
        if cuda:
            torch.cuda.reset_peak_memory_stats()  # completion.json's peak is the process's: make it this job's
        t0 = time.perf_counter()
        print(f"[trial] {job['name']}: {job['kind']} {' '.join(job['overrides'])}", flush=True)
        try:
            out = harness_job(job) if job["kind"] == "harness" else bare_job(job, results.parent / "bare-scratch")
        except Exception as exc:  # noqa: BLE001  (a failed job is recorded and the next one runs)
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc().splitlines()[-25:]}
            traceback.print_exc()
        out.update(name=job["name"], trial=job["kind"], job_wall_s=round(time.perf_counter() - t0, 2))
        if cuda:
            out["peak_cuda_mb_job"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            out["peak_cuda_reserved_mb_job"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
        failed += not out["ok"]
        with results.open("a") as f:
            f.write(json.dumps(out) + "\n")
        print(f"[trial] {job['name']}: {'ok' if out['ok'] else 'FAILED'} in {out['job_wall_s']} s", flush=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return 1 if failed else 0


COMMANDS = {"env": (env, 2), "build": (build, None), "trials": (trials, 2)}


def main(argv: list[str]) -> int:
    cmd = COMMANDS.get(argv[0]) if argv else None
    if cmd is None or (cmd[1] is not None and len(argv) - 1 != cmd[1]) or (cmd[1] is None and len(argv) < 7):
        print(__doc__, file=sys.stderr)
        return 2
    return cmd[0](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
