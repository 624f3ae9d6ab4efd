"""The figures of the GPU check (bench/gpu_check.py), computed from what a run leaves on disk and from the step
timestamps the in-process trials record: pure functions of files and numbers, torch-free, so they are unit-tested
on CPU (tests/unit/test_gpu_check.py) and a wrong figure never needs a GPU to be found.

Why each figure is computed the way it is:
- `step_s` is the median over the steps after the first: the first step of a process pays CUDA context and
  allocator warm-up, kernel selection and lazy imports, which a long run pays once.
- `sampled_tokens_per_s` divides the sampled completion tokens of those same steps (the ledger, which counts them
  exactly) by their time, so it is the rate of the steps `step_s` describes.
- `checkpoint.save_s_files` (runs started through the CLI) is the span from the first file of the final checkpoint
  to its manifest (`harness_checkpoint.json`, published last, after the digests): a slight underestimate (the
  first file's write is not in it) that needs no hook in the process. The in-process trials time the save
  exactly instead (Trainer._save_checkpoint to the end of the callbacks' on_save).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

CHECKPOINT_MANIFEST = "harness_checkpoint.json"


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a crash mid-append) and a missing file give no rows."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def after_first(values: list) -> list:
    """The values after the first (warm-up), or all of them when there is only one."""
    return list(values[1:]) if len(values) > 1 else list(values)


def median_after_first(values: list[float]) -> float | None:
    vals = after_first(values)
    return round(statistics.median(vals), 4) if vals else None


def step_figures(metrics: list[dict], ledger: list[dict]) -> dict:
    """TRL's per-step `step_time` (generation, reward, loss and backward of one optimizer step; not the optimizer
    update, logging or saves) and the ledger's sampled tokens per step (a ledger row's `step` is the 0-based
    optimizer step its generation round started at: metrics step step+1)."""
    times = {int(r["step"]): float(r["step_time"]) for r in metrics if "step_time" in r and "step" in r}
    steps = sorted(times)
    if not steps:
        return {"step_time_s": [], "step_s": None, "sampled_tokens_per_s": None, "steps_timed": 0}
    chosen = after_first(steps)
    tokens: dict[int, int] = {}
    for r in ledger:
        tokens[int(r["step"]) + 1] = tokens.get(int(r["step"]) + 1, 0) + int(r["tokens"])
    seconds = sum(times[s] for s in chosen)
    sampled = sum(tokens.get(s, 0) for s in chosen)
    return {"step_time_s": [round(times[s], 3) for s in steps], "step_s": median_after_first([times[s] for s in steps]),
            "sampled_tokens_per_s": round(sampled / seconds, 1) if ledger and seconds > 0 else None,
            "steps_timed": len(chosen)}


def checkpoint_figures(ckpt_dir: Path) -> dict | None:
    """Size of a published checkpoint and the span of its files' modification times (see the module doc)."""
    manifest = ckpt_dir / CHECKPOINT_MANIFEST
    if not manifest.is_file():
        return None
    files = [p for p in ckpt_dir.rglob("*") if p.is_file()]
    others = [p.stat().st_mtime for p in files if p != manifest]
    return {"name": ckpt_dir.name, "size_mb": round(sum(p.stat().st_size for p in files) / 2**20, 1),
            "save_s_files": round(manifest.stat().st_mtime - min(others), 3) if others else None}


def final_checkpoint(run_dir: Path, completion: dict) -> Path | None:
    """The run's last complete checkpoint (completion.json lists them by name; the final one is the highest)."""
    names = [n for n in completion.get("checkpoints", []) if n.startswith("checkpoint-")]
    if not names:
        return None
    return run_dir / "checkpoints" / max(names, key=lambda n: int(n.rsplit("-", 1)[1]))


def run_figures(run_dir: str | Path, *, verify_fn=None) -> dict:
    """What one run dir says about speed and memory, and whether it verifies (`verify_fn(run_dir) -> [violation]`,
    harness.verify.verify by default). A run without completion.json gives its status and nothing else."""
    run_dir = Path(run_dir)
    if verify_fn is None:
        from harness.verify import verify as verify_fn
    manifest = _json(run_dir / "run_manifest.json") or {}
    cfg = (manifest.get("plan") or {}).get("config") or {}
    fig = {"run_name": run_dir.name, "status": manifest.get("status"), "arm": (cfg.get("arm") or {}).get("name"),
           "tuning": (cfg.get("model") or {}).get("tuning"), "dtype": (cfg.get("model") or {}).get("dtype")}
    violations = verify_fn(run_dir)
    fig["verify"] = "ok" if not violations else violations[:10]
    comp = _json(run_dir / "completion.json")
    if comp is None:
        return fig
    for key in ("kind", "optimizer_steps", "stopped_by", "realized_completion_tokens", "realized_loss_tokens",
                "train_runtime_s", "wall_time_s", "peak_cuda_mb", "peak_rss_mb", "phases_s"):
        if key in comp:
            fig[key] = comp[key]
    fig.update(step_figures(read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "ledgers" / "rank-0.jsonl")))
    if fig["step_s"] is None and comp.get("optimizer_steps"):  # SFT logs no step_time: the run's mean
        fig["step_s"] = round(comp["train_runtime_s"] / comp["optimizer_steps"], 4)
    ckpt = final_checkpoint(run_dir, comp)
    fig["checkpoint"] = checkpoint_figures(ckpt) if ckpt else None
    return fig


def intervals(starts: list[float], ends: list[float]) -> list[float]:
    """Durations of paired events: each end minus the latest start before it (a start without its end, e.g. a
    step interrupted by a failure, is dropped)."""
    out, i = [], 0
    for end in ends:
        while i + 1 < len(starts) and starts[i + 1] <= end:
            i += 1
        if i < len(starts) and starts[i] <= end:
            out.append(round(end - starts[i], 4))
    return out


def tokens_per_s(step_tokens: list[int], step_seconds: list[float]) -> float | None:
    """Sampled tokens per second over the steps after the first (both lists one entry per step, in order)."""
    n = min(len(step_tokens), len(step_seconds))
    tokens, seconds = after_first(step_tokens[:n]), after_first(step_seconds[:n])
    return round(sum(tokens) / sum(seconds), 1) if seconds and sum(seconds) > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
