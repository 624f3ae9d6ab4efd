"""Find and read the run dirs a report covers. Torch-free; reads only, never writes into a run dir.

What DIR can be:
- a sweep folder (`<output_root>/sweeps/<time>/`, has jobs/<n>.json): exactly the run dirs its
  jobs point at (an RL job's SFT warm-start parent is not a job and is not included);
- an output_root (has runs/ or sweeps/): every run dir under runs/ (smoke runs and caches live
  elsewhere), and every job of every sweeps/*/jobs/*.json, for the failed-jobs list;
- a run dir (has run_manifest.json): that run alone;
- any other folder: every run dir below it (a run dir's own subfolders are not searched; hidden
  folders are skipped), and the jobs of any sweep folder found on the way.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.accounting.logs import METRICS_PATH
from harness.eval import artifact_path, periodic_evals
from harness.identity import at_old_default
from harness.metrics import RELATIONS
from harness.rundir import completion_kind

MANIFEST = "run_manifest.json"
PATH_KEYS = ("root", "path", "base_path", "cache_dir")  # where a thing lies is not what it is


@dataclass
class Job:
    sweep: str
    job: int | None
    overrides: list[str]
    status: str
    exit_code: int | None
    error: str | None  # first line of the error message
    run_dir: str | None


@dataclass
class Source:
    kind: str  # sweep | output_root | run | folder
    dir: Path
    run_paths: list[Path]
    jobs: list[Job]
    notes: list[str] = field(default_factory=list)


@dataclass
class Run:
    path: Path
    name: str
    manifest: dict
    completion: dict | None
    complete: bool
    status: str  # completion status when complete, else the manifest's (or why it is unreadable)
    arm: str
    seed: int | None
    semantic: dict  # flattened plan.config without seed and the run's non-semantic fields
    identity: dict  # the most resolved identity (completion > manifest > plan)
    parent: str | None  # run name of the SFT warm start this run started from
    eval_split: str
    eval_after: dict | None = None
    eval_before: dict | None = None
    curve: dict | None = None  # {"step": [...], "tokens": [...], "reward": [...]} for RL runs
    eval_curve: list[dict] = field(default_factory=list)  # RL: [{"tokens", "accuracy", "per_relation", "label"}]
    diagnostics: dict[str, dict[int, float]] = field(default_factory=dict)  # metrics.jsonl: key -> {step: value}
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, float | None] = field(default_factory=dict)
    items: dict[str, tuple[float, str | None]] | None = field(default=None, repr=False)  # read_items, on first use


# --- discovery


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def find_run_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """(run dirs, sweep folders) at or below `root` (links followed: a folder of links to run dirs picks runs); run
    dirs' subfolders and hidden folders are not searched."""
    runs: list[Path] = []
    sweeps: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # a folder of links picks runs
        if MANIFEST in filenames:
            runs.append(Path(dirpath))
            dirnames[:] = []
            continue
        if "jobs" in dirnames and "multirun.yaml" in filenames:
            sweeps.append(Path(dirpath))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return sorted(runs), sorted(sweeps)


def _first_line(error: Any) -> str | None:
    if error is None:
        return None
    if isinstance(error, dict):
        text = f"{error.get('type', 'Error')}: {error.get('message', '')}"
    else:
        text = str(error)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text.strip()


def read_jobs(sweep_dir: Path) -> tuple[list[Job], list[str]]:
    jobs, notes = [], []
    for p in sorted((sweep_dir / "jobs").glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            notes.append(f"unreadable job record {p}: {exc}")
            jobs.append(Job(str(sweep_dir), None, [], "unreadable", None, str(exc), None))
            continue
        jobs.append(Job(sweep=str(sweep_dir), job=rec.get("job"), overrides=list(rec.get("overrides") or []),
                        status=str(rec.get("status")), exit_code=rec.get("exit_code"),
                        error=_first_line(rec.get("error")), run_dir=rec.get("run_dir")))
    return jobs, notes


def job_run_path(job: Job, sweep_dir: Path) -> Path | None:
    """The job's run dir; when the sweep was moved, the same name under <output_root>/runs."""
    if not job.run_dir:
        return None
    p = Path(job.run_dir)
    if is_run_dir(p):
        return p
    moved = sweep_dir.parent.parent / "runs" / p.name
    return moved if is_run_dir(moved) else None


def discover(root: Path) -> Source:
    root = Path(root)
    if is_run_dir(root):
        return Source("run", root, [root], [])
    if (root / "jobs").is_dir() and any((root / "jobs").glob("*.json")):
        jobs, notes = read_jobs(root)
        paths: list[Path] = []
        for j in jobs:
            p = job_run_path(j, root)
            if p is not None and p not in paths:
                paths.append(p)
            elif p is None and j.run_dir and j.status == "completed":
                notes.append(f"job {j.job}: its run dir {j.run_dir} does not exist (moved or deleted?)")
        return Source("sweep", root, paths, jobs, notes)
    if (root / "runs").is_dir() or (root / "sweeps").is_dir():
        paths = find_run_dirs(root / "runs")[0] if (root / "runs").is_dir() else []
        sweeps = sorted(p for p in (root / "sweeps").glob("*") if (p / "jobs").is_dir())
        return Source("output_root", root, paths, *_jobs_of(sweeps))
    paths, sweeps = find_run_dirs(root)
    return Source("folder", root, paths, *_jobs_of(sweeps))


def _jobs_of(sweeps: list[Path]) -> tuple[list[Job], list[str]]:
    jobs: list[Job] = []
    notes: list[str] = []
    for sweep in sweeps:
        j, n = read_jobs(sweep)
        jobs += j
        notes += n
    return jobs, notes


# --- reading one run dir


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def flatten(config: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in config.items():
        key = prefix + str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _resolved_identity(manifest: dict, completion: dict | None) -> dict:
    """Per part, the first source that has it filled: completion.json, then the manifest, then the plan.

    The plan records data content and model file digests as null when they are not on disk yet
    (train fills them into the manifest's identity), so the plan is the last resort.
    """
    sources = [(completion or {}).get("identity") or {}, manifest.get("identity") or {},
               (manifest.get("plan") or {}).get("identity") or {}]
    out: dict = {}
    for part in ("data", "model", "teacher", "code", "environment", "semantic_sha256", "config_sha256"):
        found = [s[part] for s in sources if s.get(part) is not None]
        filled = [f for f in found if not isinstance(f, dict) or all(v is not None for k, v in f.items()
                                                                      if k.endswith("sha256"))]
        out[part] = (filled or found or [None])[0]
    return out


def _eval_block(run_dir: Path, split: str, label: str, fallback: dict | None) -> dict | None:
    p = artifact_path(run_dir, split, label)
    if p.is_file():
        try:
            return _read_json(p)
        except (OSError, ValueError):
            pass
    return fallback if isinstance(fallback, dict) else None


def _read_jsonl(paths: list[Path], notes: list[str]) -> list[dict]:
    rows: list[dict] = []
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    notes.append(f"{p.parent.name}/{p.name}:{i}: unparsable line skipped")
    return rows


def read_curve(run_dir: Path, notes: list[str]) -> dict | None:
    """Per `step` value: sampled tokens summed over every rank's ledger, mean trace reward of its completions."""
    ledgers = sorted((run_dir / "ledgers").glob("rank-*.jsonl"))
    traces = sorted((run_dir / "traces").glob("rank-*.jsonl"))
    if not ledgers:
        return None
    tokens: dict[int, int] = {}
    for row in _read_jsonl(ledgers, notes):
        tokens[row["step"]] = tokens.get(row["step"], 0) + int(row["tokens"])
    rsum: dict[int, float] = {}
    rcnt: dict[int, int] = {}
    ages, weights = [], []  # rollout=async: each completion's policy age and importance weight (its mean)
    for row in _read_jsonl(traces, notes):
        if row.get("is_weight") is not None:
            ages.append(row["policy_age"])
            weights.append((row["is_weight"]["mean"], row["is_weight"]["max"]))
        if row.get("reward") is None:
            continue
        rsum[row["step"]] = rsum.get(row["step"], 0.0) + float(row["reward"])
        rcnt[row["step"]] = rcnt.get(row["step"], 0) + 1
    steps = sorted(tokens)
    return {"step": steps, "tokens": [tokens[s] for s in steps],
            "reward": [rsum[s] / rcnt[s] if s in rcnt else None for s in steps],
            "reward_sum": rsum, "reward_count": rcnt, "ages": ages, "weights": weights}


def read_run(path: Path) -> Run:
    path = Path(path)
    notes: list[str] = []
    try:
        manifest = _read_json(path / MANIFEST)
    except (OSError, ValueError) as exc:
        manifest = {}
        notes.append(f"unreadable {MANIFEST}: {exc}")
    completion = None
    if (path / "completion.json").is_file():
        try:
            completion = _read_json(path / "completion.json")
        except (OSError, ValueError) as exc:
            notes.append(f"unreadable completion.json: {exc}")
    plan = manifest.get("plan") or {}
    config = plan.get("config") or {}
    complete = bool(completion) and completion.get("status") == "completed"
    if complete:
        status = "completed"
    elif completion:
        status = f"completion.json status {completion.get('status')!r}"
    else:
        status = f"{manifest.get('status', 'unreadable manifest')} (no completion.json)"
    arm = ((config.get("arm") or {}).get("name") or (plan.get("choices") or {}).get("arm")
           or (completion or {}).get("arm") or "?")
    non_semantic = set((manifest.get("identity") or plan.get("identity") or {}).get("non_semantic_fields") or [])
    semantic = {k: v for k, v in flatten(config).items() if k != "seed" and k not in non_semantic
                and not at_old_default(k, v)}  # runs from before such a field stay one condition
    reward = ((manifest.get("plan") or {}).get("identity") or manifest.get("identity") or {}).get("reward") or {}
    if reward.get("code_sha256"):  # a reward file's version, as the run name carries it: an edited reward is
        semantic["reward.code_sha256"] = reward["code_sha256"][:8]  # another condition, not a duplicate seed
    parent = ((completion or {}).get("parent") or manifest.get("parent") or {})
    split = (config.get("data") or {}).get("eval_split") or "test"
    run = Run(path=path, name=manifest.get("run_name") or path.name, manifest=manifest, completion=completion,
              complete=complete, status=status, arm=str(arm), seed=config.get("seed"), semantic=semantic,
              identity=_resolved_identity(manifest, completion), parent=parent.get("run_name"), eval_split=split,
              notes=notes)
    if not complete:
        return run
    run.eval_after = _eval_block(path, split, "final", completion.get("eval_after"))
    run.eval_before = _eval_block(path, split, "before", completion.get("eval_before"))
    run.curve = read_curve(path, notes)
    run.metrics = run_metrics(run)
    if run.curve is not None:
        run.eval_curve = read_eval_curve(run)
        run.diagnostics = read_diagnostics(path, notes)
    return run


def _accuracies(block: dict) -> dict:
    return {"accuracy": _get(block, "accuracy"),
            "per_relation": {rel: _get(block, "per_relation", rel, "accuracy") for rel in RELATIONS}}


def read_eval_curve(run: Run) -> list[dict]:
    """Held-out accuracy by the sampled tokens spent before it: the eval before training (0 tokens), each periodic
    eval (train.eval_steps: eval/<split>-checkpoint-N.json), the final eval (all the run's tokens)."""
    out = []
    if run.eval_before and _get(run.eval_before, "accuracy") is not None:
        out.append({"tokens": 0.0, "label": "before", **_accuracies(run.eval_before)})
    for res in periodic_evals(run.path, run.eval_split):
        if _get(res, "completion_tokens") is not None and _get(res, "accuracy") is not None:
            out.append({"tokens": float(res["completion_tokens"]), "label": res["artifact"], **_accuracies(res)})
    if run.eval_after and _get(run.eval_after, "accuracy") is not None and run.metrics.get("budget/tokens") is not None:
        out.append({"tokens": run.metrics["budget/tokens"], "label": "final", **_accuracies(run.eval_after)})
    return out


def read_items(run: Run) -> dict[str, tuple[float, str | None]]:
    """The final eval's score of every view (eval/<split>.predictions.jsonl, one row per view): view id -> (correct
    as 1.0 / 0.0, relation); {} without the file. Read on first use and kept on the run: only the report's per-item
    statistics (harness.report.analysis) pay for it, not every reader of a run (harness.sweep)."""
    if run.items is None:
        p = artifact_path(run.path, run.eval_split, "final").with_suffix(".predictions.jsonl")
        rows = _read_jsonl([p], run.notes) if run.complete and p.is_file() else []
        run.items = {str(r["view"]): (1.0 if r["correct"] else 0.0, r.get("relation")) for r in rows
                     if r.get("view") is not None and isinstance(r.get("correct"), bool)}
    return run.items


#: metrics.jsonl keys the report draws for every RL arm (when logged); an arm's own terms (loss/<term>,
#: <arm>/<stat>) are found by prefix. TRL's names (trl/trainer/grpo_trainer.py, GRPOTrainer._metrics).
SHARED_DIAGNOSTICS = ("reward", "reward_std", "frac_reward_zero_std", "loss", "kl", "entropy", "grad_norm",
                      "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean")
OWN_PREFIXES = ("loss/",)


def read_diagnostics(run_dir: Path, notes: list[str]) -> dict[str, dict[int, float]]:
    """metrics.jsonl's training diagnostics: the shared ones and the arm's own terms, key -> {step: value}."""
    p = run_dir / METRICS_PATH
    if not p.is_file():
        return {}
    out: dict[str, dict[int, float]] = {}
    for row in _read_jsonl([p], notes):
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for k, v in row.items():
            own = k.startswith(OWN_PREFIXES) or ("/" in k and k.split("/", 1)[0] not in ("budget", "clip_ratio",
                                                                                        "completions", "rewards"))
            if (k in SHARED_DIAGNOSTICS or own) and isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and math.isfinite(v):
                out.setdefault(k, {})[step] = float(v)
    return out


# --- per-run metrics (the keys of report.json)


def _get(block: dict | None, *keys: str) -> float | None:
    node: Any = block
    for k in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(k)
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def train_reward_last(curve: dict | None, fraction: float = 0.1) -> float | None:
    """Mean reward over the completions of the last ceil(10%) of the steps that have trace rows."""
    if not curve or not curve["reward_count"]:
        return None
    steps = sorted(curve["reward_count"])
    tail = steps[-max(1, math.ceil(fraction * len(steps))):]
    return sum(curve["reward_sum"][s] for s in tail) / sum(curve["reward_count"][s] for s in tail)


def run_metrics(run: Run) -> dict[str, float | None]:
    c, after, before = run.completion or {}, run.eval_after, run.eval_before
    m: dict[str, float | None] = {
        "eval/accuracy": _get(after, "accuracy"),
        "eval/accuracy_before": _get(before, "accuracy"),
    }
    a, b = m["eval/accuracy"], m["eval/accuracy_before"]
    m["eval/accuracy_change"] = a - b if a is not None and b is not None else None
    for rel in RELATIONS:
        m[f"eval/{rel}/accuracy"] = _get(after, "per_relation", rel, "accuracy")
    m["eval/FULL/abstention_rate"] = _get(after, "per_relation", "FULL", "abstention_rate")
    m["eval/format_valid"] = _get(after, "format_valid")
    m["eval/direction_accuracy"] = _get(after, "direction_accuracy")
    m["train/reward_last10pct"] = train_reward_last(run.curve)
    if completion_kind(c) == "rl":  # sampled completion tokens
        tokens, ceiling = _get(c, "realized_completion_tokens"), _get(c, "completion_token_ceiling")
    else:  # SFT: loss tokens (no ledger)
        tokens, ceiling = _get(c, "realized_loss_tokens"), _get(c, "loss_token_ceiling")
    m["budget/tokens"], m["budget/ceiling"] = tokens, ceiling
    m["budget/fraction"] = tokens / ceiling if tokens is not None and ceiling else None
    m["train/optimizer_steps"] = _get(c, "optimizer_steps")
    m["perf/wall_time_s"] = _get(c, "wall_time_s")
    m["perf/first_step_s"] = own_first_step(c.get("start_phases_s"))  # the process that finished it, parent excluded
    m.update(offpolicy_metrics(run.curve))
    if run.curve is not None and "realized_completion_tokens" in c and sum(run.curve["tokens"]) != tokens:
        run.notes.append(f"ledger tokens sum to {sum(run.curve['tokens'])}, completion.json says {int(tokens)}")
    return m


def offpolicy_metrics(curve: dict | None) -> dict[str, float | None]:
    """rollout=async: the mean policy age of the trained completions, how far their importance weights drifted
    from 1 (mean |w - 1| of each completion's mean weight) and the share of completions the caps masked (every
    weight 0). None for a run whose trace carries no weights."""
    ages, weights = (curve or {}).get("ages"), (curve or {}).get("weights")
    if not ages:
        return {"offpolicy/mean_age": None, "offpolicy/weight_drift": None, "offpolicy/masked": None}
    return {"offpolicy/mean_age": sum(ages) / len(ages),
            "offpolicy/weight_drift": sum(abs(mean - 1.0) for mean, _ in weights) / len(weights),
            "offpolicy/masked": sum(1 for _, top in weights if top == 0.0) / len(weights)}


def own_first_step(marks: dict | None) -> float | None:
    """Seconds from the start of the run's own stages to its first optimizer step, in one process start: the start
    phases count from the process's start on the plan, which includes the plan's parent (the SFT warm start, a
    teacher) when that process ran it first (`parent`); that is taken off (the first run of a process still pays the
    imports). None without a first step."""
    first = _get(marks, "first_step")
    if first is None:
        return None
    return max(0.0, first - (_get(marks, "parent") or 0.0))


def starts(run: Run) -> list[dict]:
    """Every process start of the run (resumes included) with its start phases: seconds from that start to the
    end of imports, data, model, the first optimizer step, ... (the manifest's `start_phases`)."""
    return [s for s in run.manifest.get("start_phases") or [] if isinstance(s, dict)]


def budget_kind(run: Run) -> str:
    return "sampled" if completion_kind(run.completion or {}) == "rl" else "loss"
