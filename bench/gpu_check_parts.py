"""The steps of the GPU check (bench/gpu_check.py): the command line of each, what it needs, its timeout, how its
figures are collected from what it left, and the summary printed at the end. Torch-free: the driver only starts
processes and reads files.

Timeouts are sized from what was measured on the H200 node (10-13 s of imports per
process, a tiny debug run 18-30 s) with about 3x margin, so a slow step is still measured while a hang costs only
its own part; with --cpu they are 3x longer again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gpu_check_figures as figs

PARTS = ("env", "arms_tiny", "arms_fixture", "parity", "qwen3b")
ARMS = ("sft", "grpo", "papo", "evi_po", "opd")
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
RESULT = "GPU_CHECK_RESULT "  # a child's line carrying its JSON figures
TIMEOUTS_S = {"env": 90, "arms_tiny.multirun": 240, "arms_tiny.smoke": 200, "fixtures.build": 120, "parity": 120,
              "arms_fixture.multirun": 240, "arms_fixture.full": 150, "qwen3b.build": 240, "qwen3b.lora": 330,
              "qwen3b.full": 330}
DISK_NEEDED_GB = 45  # the 3B snapshot (7.5 GB) + a full run's final checkpoint (~22 GB) and final policy (7.5 GB)

CHILD = str(Path(__file__).resolve().parent / "gpu_check_child.py")


@dataclass
class Step:
    """One child process of a part. `collect(result) -> (figures, problems)` reads what it left; any problem
    fails the step. `skip_rc`: exit codes that mean "not applicable here" (with the reason), not a failure."""

    name: str
    part: str
    argv: list[str]
    timeout_s: float
    collect: Callable[[dict], tuple[dict, list[str]]] | None = None
    needs: tuple[str, ...] = ()
    skip_rc: dict[int, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    go: str | None = None  # a go file: the child may start ahead of its turn and wait for it (Check.prestart)


@dataclass
class Config:
    cpu: bool
    work: Path
    python: str
    steps: int
    full_steps: int

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def describe(self) -> dict:
        return {"device": self.device, "lora_steps": self.steps, "full_steps": self.full_steps,
                "qwen3b": {"shape": "tiny" if self.cpu else "3b", "image_size": self.image_size,
                           "max_completion_length": self.completion_length, "prompts_per_step": 4,
                           "num_generations": 8, "dtype": self.dtype}, "tiny_overrides": self.tiny_extra}

    @property
    def dtype(self) -> str:
        return "float32" if self.cpu else "bfloat16"

    @property
    def image_size(self) -> int:
        return 56 if self.cpu else 448

    @property
    def completion_length(self) -> int:
        return 32 if self.cpu else 256

    @property
    def tiny_extra(self) -> list[str]:
        """--cpu: debug=tiny made shorter still (2 RL steps, a 4-step warm start that cannot learn the answer format:
        its format check off), so the dry run takes minutes."""
        return ["budget.max_completion_tokens=1024", "budget.max_steps=6", "budget.sft_warm_start_steps=4",
                "budget.sft_warm_start_min_format=0", "data.eval_max_items=8"] if self.cpu else []

    def timeout(self, name: str) -> float:
        return TIMEOUTS_S[name] * (3 if self.cpu else 1)


def plan_steps(cfg: Config, wanted: set[str]) -> tuple[Step, list[list[Step]], list[Step]]:
    """(the env step, the lanes run side by side, the 3B trials run alone afterwards). Four lanes of 1-1.5 min each
    on an H200: the tiny arms; the fixtures and the arms on one; the 3B build, parity and the full-tuning fixture
    run; the smoke test. A step's `needs` are earlier in its lane or in an earlier lane, so the lanes can also run
    one after the other (--cpu, --jobs 1). Each lane has its own output_root: no two processes share a cache."""
    py, w, dev = cfg.python, cfg.work, cfg.device
    harness, on, arms = [py, "-m", "harness"], [f"placement.device={dev}"], "arm=" + ",".join(ARMS)
    fix, fix_dtype = w / "fixtures", ([f"model.dtype={cfg.dtype}"] if cfg.cpu else [])
    # a random-weight checkpoint's short warm start never writes the answer format: these runs check the pipeline,
    # not learning, so the warm start's format check (budget.sft_warm_start_min_format) is off for them
    fix_model = ["model=qwen", f"model.path={fix / 'qwen2_5_vl'}", *fix_dtype, "budget.sft_warm_start_min_format=0"]
    env = Step("env", "env", [py, CHILD, "env", str(w), dev], cfg.timeout("env"), collect=collect_env)
    tiny, fixture, side, smoke, trials = [], [], [], [], []
    if "arms_tiny" in wanted:
        root, smoke_root = w / "tiny", w / "tiny_smoke"
        tiny.append(Step("arms_tiny.multirun", "arms_tiny", [*harness, "-m", arms, "debug=tiny", *on, *cfg.tiny_extra,
                                                             f"output_root={root}"], cfg.timeout("arms_tiny.multirun"),
                         collect=lambda r, root=root: collect_multirun(root)))
        smoke_extra = [o for o in cfg.tiny_extra
                       if not o.startswith(("budget.max_completion_tokens", "budget.max_steps"))]
        smoke.append(Step("arms_tiny.smoke", "arms_tiny", [*harness, "run_mode=smoke", "debug=tiny", *on, *smoke_extra,
                                                           f"output_root={smoke_root}"], cfg.timeout("arms_tiny.smoke"),
                          collect=lambda r, root=smoke_root: collect_smoke(root, r)))
    if "arms_fixture" in wanted or "parity" in wanted:
        fixture.append(Step("fixtures.build", "arms_fixture" if "arms_fixture" in wanted else "parity",
                            [py, CHILD, "build", str(fix), "tiny", "cpu", "float32", "0", *FAMILIES],
                            cfg.timeout("fixtures.build"), collect=lambda r: ({"fixtures": _result(r)}, [])))
    if "arms_fixture" in wanted:
        root = w / "fix"
        fixture.append(Step("arms_fixture.multirun", "arms_fixture", [*harness, "-m", arms, *fix_model, "debug=tiny",
                                                                      *on, *cfg.tiny_extra, f"output_root={root}"],
                            cfg.timeout("arms_fixture.multirun"), collect=lambda r, root=root: collect_multirun(root),
                            needs=("fixtures.build",)))
    if "qwen3b" in wanted:
        shape, need = ("tiny", 0) if cfg.cpu else ("3b", DISK_NEEDED_GB)
        side.append(Step("qwen3b.build", "qwen3b", [py, CHILD, "build", str(w / "qwen3b"), shape, dev, cfg.dtype,
                                                    str(need), "qwen2_5_vl"], cfg.timeout("qwen3b.build"),
                         collect=lambda r: ({"build": _result(r)["qwen2_5_vl"]}, [])))
        trials = [trial_step(cfg, "lora", [("grpo-lora", "harness", "grpo", "lora"),  # the ratio's pair back to back
                                           ("grpo-lora-bare", "bare", "grpo", "lora"),
                                           ("papo-lora", "harness", "papo", "lora")]),
                  trial_step(cfg, "full", [("grpo-full", "harness", "grpo", "full"),
                                           ("papo-full", "harness", "papo", "full")])]
    if "parity" in wanted:
        side.append(Step("parity", "parity", [py, "-m", "harness.models.parity", *(str(fix / f) for f in FAMILIES),
                                              "--json"], cfg.timeout("parity"), collect=collect_parity,
                         needs=("fixtures.build",),
                         skip_rc={2: "no torchvision here (harness.models.parity exit 2)"} if cfg.cpu else {}))
    if "arms_fixture" in wanted:
        root = w / "fix_full"
        side.append(Step("arms_fixture.full", "arms_fixture", [*harness, "arm=grpo", *fix_model, "model.tuning=full",
                                                               "debug=tiny", *on, *cfg.tiny_extra,
                                                               f"output_root={root}"],
                         cfg.timeout("arms_fixture.full"), needs=("fixtures.build",),
                         collect=lambda r, root=root: collect_single(root, "grpo", "full", "full")))
    return env, [lane for lane in (tiny, fixture, side, smoke) if lane], trials


def trial_overrides(cfg: Config, arm: str, tuning: str) -> list[str]:
    """The realistic plan: one image per prompt, 4 prompts x 8 generations x max length, no SFT warm start, eval
    off, only the final checkpoint (train.save_steps past the run), the token budget lifted so max_steps binds."""
    steps = cfg.steps if tuning == "lora" else cfg.full_steps
    return [f"arm={arm}", "model=qwen", f"model.path={cfg.work / 'qwen3b' / 'qwen2_5_vl'}", f"model.tuning={tuning}",
            f"model.dtype={cfg.dtype}", f"placement.device={cfg.device}", "arm.init=scratch",
            f"data.image_size={cfg.image_size}", "data.n_base=40", "arm.prompts_per_step=4", "arm.num_generations=8",
            f"arm.max_completion_length={cfg.completion_length}", f"budget.max_steps={steps}",
            "budget.max_completion_tokens=100000000", "train.save_steps=100000", "train.eval_before=false",
            "train.eval_after=false", f"output_root={cfg.work / 'q3b'}"]


def trial_step(cfg: Config, name: str, jobs: list[tuple[str, str, str, str]]) -> Step:
    d = cfg.work / "trials"
    d.mkdir(parents=True, exist_ok=True)
    spec, results = d / f"{name}.json", d / f"{name}.jsonl"
    spec.write_text(json.dumps({"jobs": [{"name": n, "kind": k, "overrides": trial_overrides(cfg, arm, tuning),
                                          "cleanup": True} for n, k, arm, tuning in jobs]}, indent=1))
    results.unlink(missing_ok=True)
    return Step(f"qwen3b.{name}", "qwen3b", [cfg.python, CHILD, "trials", str(spec), str(results)],
                cfg.timeout(f"qwen3b.{name}"), needs=("qwen3b.build",), go=str(d / f"{name}.go"),
                collect=lambda r, results=results: collect_trials(results, [j[0] for j in jobs]))


# ---- collectors: (figures, problems) from what a step left ----

def _result(r: dict) -> dict:
    for line in reversed(_log_lines(r)):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise ValueError(f"no {RESULT.strip()} line in the step's output")


def _log_lines(r: dict) -> list[str]:
    path = r.get("log_path")
    return Path(path).read_text(errors="replace").splitlines() if path else list(r.get("tail", []))


def collect_env(r: dict) -> tuple[dict, list[str]]:
    env = _result(r)
    return {"env": env}, [] if r["rc"] == 0 else ["torch.cuda.is_available() is False: no usable CUDA device"]


def _verify_all(root: Path, skip: set[str]) -> tuple[dict, list[str]]:
    """Every other run dir under root/runs (SFT warm starts, opd's teacher): verified, by name."""
    from harness.verify import verify

    out, problems = {}, []
    for run in sorted(p for p in (root / "runs").glob("*") if p.is_dir() and p.name not in skip):
        v = verify(run)
        out[run.name] = "ok" if not v else v[:5]
        problems += [f"{run.name}: {x}" for x in v[:5]]
    return out, problems


def collect_multirun(root: Path) -> tuple[dict, list[str]]:
    """Each arm's run of the newest sweep under root (sweep.json names its run dirs), every run dir verified."""
    sweeps = sorted((root / "sweeps").glob("*/sweep.json"), key=lambda p: p.stat().st_mtime)
    if not sweeps:
        return {}, [f"no sweep.json under {root / 'sweeps'}"]
    sweep = json.loads(sweeps[-1].read_text())
    runs, problems = {}, [f"sweep job {j} failed" for j in sweep.get("failed", [])]
    for job in sweep.get("runs", []):
        arm = next((o.split("=", 1)[1] for o in job.get("overrides", []) if o.startswith("arm=")), f"job{job['job']}")
        runs[arm] = slim(figs.run_figures(job["run_dir"]))
        if runs[arm].get("verify") != "ok" or runs[arm].get("status") != "completed":
            problems.append(f"{arm}: status {runs[arm].get('status')}, verify {runs[arm].get('verify')}")
    problems += [f"{a}: no run" for a in ARMS if a not in runs]
    others, bad = _verify_all(root, {Path(j["run_dir"]).name for j in sweep.get("runs", [])})
    note = ("peak_cuda_mb is completion.json's: torch.cuda.max_memory_allocated() of the whole multirun process, "
            "never reset between its jobs, so each job's value includes the jobs before it")
    return {"runs": runs, "other_runs_verify": others, "peak_cuda_mb_note": note}, problems + bad


def collect_single(root: Path, arm: str, tuning: str, key: str) -> tuple[dict, list[str]]:
    """The one run of `arm` with `tuning` under root (its SFT warm start is the other new run dir)."""
    for run in sorted((root / "runs").glob(f"{arm}-*")):
        cfg = ((figs._json(run / "run_manifest.json") or {}).get("plan") or {}).get("config") or {}
        if cfg.get("model", {}).get("tuning") == tuning:
            f = slim(figs.run_figures(run))
            ok = f.get("verify") == "ok" and f.get("status") == "completed"
            return {key: f}, [] if ok else [f"{run.name}: status {f.get('status')}, verify {f.get('verify')}"]
    return {}, [f"no {arm} run with model.tuning={tuning} under {root / 'runs'}"]


def collect_smoke(root: Path, r: dict) -> tuple[dict, list[str]]:
    line = next((ln for ln in reversed(_log_lines(r)) if "smoke:" in ln), "")
    passed = "smoke: passed" in line
    verified, problems = _verify_all(root / "smoke", set())
    return {"smoke": {"passed": passed, "line": line.split("] ", 1)[-1], "runs_verify": verified}}, \
        ([] if passed else ["no 'smoke: passed' line"]) + problems


def collect_parity(r: dict) -> tuple[dict, list[str]]:
    out, problems = {}, []
    for line in _log_lines(r):
        if line.startswith("{"):
            try:
                rep = json.loads(line)
            except json.JSONDecodeError:
                continue
            pvt = rep.get("pil_vs_torchvision", {})
            out[rep["family"]] = {"ok": rep["ok"], "backends": rep.get("backends"), "grids": rep.get("grids"),
                                  "pil_vs_torchvision_max_abs_diff": pvt.get("pixel_values_max_abs_diff"),
                                  "pil_vs_torchvision_equal": pvt.get("equal_keys")}
            if not rep["ok"]:
                problems.append(f"{rep['family']}: the image-only processor differs from the stock one")
    problems += [f"{f}: not compared" for f in FAMILIES if f not in out]
    return {"parity": out}, problems


def collect_trials(results: Path, names: list[str]) -> tuple[dict, list[str]]:
    rows = {r["name"]: r for r in figs.read_jsonl(results)}
    runs, problems = {}, []
    for n in names:
        if n not in rows:
            problems.append(f"{n}: did not finish")
            continue
        runs[n] = slim(rows[n])
        if not rows[n].get("ok"):
            why = rows[n].get("error") or rows[n].get("verify") or f"exit code {rows[n].get('exit_code')}"
            problems.append(f"{n}: failed: {why}")
    out = {"runs": runs}
    h, b = rows.get("grpo-lora"), rows.get("grpo-lora-bare")
    if h and b:
        out["harness_over_bare"] = {
            "wall_step": figs.ratio(h.get("wall_s_per_step"), b.get("wall_s_per_step")),
            "trl_step_time": figs.ratio(h.get("step_s"), b.get("step_s")),
            "same_completions": h.get("completion_tokens") == b.get("completion_tokens"),
            "steps": len(h.get("wall_step_s") or [])}
    return out, problems


def slim(f: dict) -> dict:
    """A run's figures without the per-completion lists (they only serve the same-completions check)."""
    return {k: v for k, v in f.items() if k != "completion_tokens"}


def part_status(statuses: list[str]) -> str:
    if "failed" in statuses:
        return "failed"
    if "timeout" in statuses:
        return "timeout"
    if statuses and all(s == "skipped" for s in statuses):
        return "skipped"
    if any(s in ("running", "pending") for s in statuses):
        return "running"
    return "ok"


def _g(x, fmt="{:.2f}", none="-") -> str:
    return none if x is None else fmt.format(x)


def summary_lines(report: dict, out: Path) -> list[str]:
    """The human-readable end of the log: one line per part, the 3B table, where the figures are."""
    ps, env = report["parts"], report["parts"]["env"]["figures"].get("env", {})
    lines = ["", f"== gpu_check ({report['mode']}; {env.get('gpu') or 'no GPU'}; torch {env.get('torch')}) "
                 f"{'PASSED' if report.get('ok') else 'FAILED: ' + ', '.join(report.get('failed', []))}; "
                 f"{report['wall_s']:.0f} s (budget {report['budget_s']} s on one H200) =="]
    for name in PARTS:
        p = ps[name]
        lines.append(f"  {name:13} {p['status']:8} {p.get('wall_s', 0):7.1f} s  {_part_line(name, p['figures'])}")
        for sname, s in p["steps"].items():
            if s["status"] != "ok":
                why = s.get("reason") or "; ".join(s.get("problems", []))
                lines.append(f"      {sname}: {s['status']} {why[:300]}")
    runs = ps["qwen3b"]["figures"].get("runs", {})
    if runs:
        lines.append(f"  {'3B run':16} {'s/step':>7} {'TRL s':>7} {'tok/s':>7} {'peakGiB':>8} {'ckpt s':>7} "
                     f"{'ckpt/st':>7} {'ckptGiB':>8} {'job s':>7}   (steps after the first; ckpt: the final one, "
                     "its save with the harness's digests and manifest; ckpt/st: it in steps)")
        for n, f in runs.items():
            ck = f.get("checkpoint") or {}
            save, per = (f.get("checkpoint_save_s") or [None])[-1], f.get("wall_s_per_step")
            in_steps = save / per if save is not None and per else None
            lines.append(f"  {n:16} {_g(per):>7} {_g(f.get('step_s')):>7} "
                         f"{_g(f.get('wall_tokens_per_s'), '{:.0f}'):>7} {_g(_gb(f.get('peak_cuda_mb_job'))):>8} "
                         f"{_g(save):>7} {_g(in_steps, '{:.1f}'):>7} {_g(_gb(ck.get('size_mb'), 1024)):>8} "
                         f"{_g(f.get('job_wall_s'), '{:.0f}'):>7}")
        hb = ps["qwen3b"]["figures"].get("harness_over_bare")
        if hb:
            lines.append(f"  harness / bare TRL (grpo LoRA, steps after the first): wall step "
                         f"{_g(hb['wall_step'], '{:.3f}')}, TRL step_time {_g(hb['trl_step_time'], '{:.3f}')}; "
                         f"same completion lengths {hb['same_completions']}")
    lines.append(f"  figures: {out / 'gpu_check.json'}; logs: {out / 'logs'}")
    return lines


def _gb(mb, div=1024):
    return None if mb is None else mb / div


def _part_line(name: str, f: dict) -> str:
    if name == "env" and f.get("env"):
        e = f["env"]
        return (f"torch {e.get('torch')}, transformers {e.get('transformers')}, trl {e.get('trl')}, "
                f"torchvision {e.get('torchvision')}, {e.get('gpu') or 'cpu'}, {e.get('free_disk_gb')} GB free")
    if name in ("arms_tiny", "arms_fixture") and f.get("runs"):
        bits = [f"{a} {r.get('optimizer_steps')} st {_g(r.get('step_s'))} s/st "
                f"{'verify ok' if r.get('verify') == 'ok' else 'VERIFY FAILED'}" for a, r in f["runs"].items()]
        peaks = [r["peak_cuda_mb"] for r in f["runs"].values() if r.get("peak_cuda_mb")]
        bits += [f"peak {max(peaks):.0f} MB"] if peaks else []
        extra = f.get("full") and f"; full grpo {f['full'].get('optimizer_steps')} st {f['full'].get('verify')}"
        smoke = f.get("smoke") and f"; smoke {'passed' if f['smoke']['passed'] else 'FAILED'}"
        return ", ".join(bits) + (extra or "") + (smoke or "")
    if name == "parity" and f.get("parity"):
        return ", ".join(f"{k} {'EQUAL' if v['ok'] else 'MISMATCH'}" for k, v in f["parity"].items())
    if name == "qwen3b" and f.get("build"):
        return f"build {f['build']['build_s']} s ({f['build']['size_gb']} GB)"
    return ""

