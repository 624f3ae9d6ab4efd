"""Shared fixtures: one Hydra compose fixture for every config test, and subprocess helpers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

# Every training a test starts, in process or as a subprocess, runs on one thread (but the default job's, which is
# the README's job as a user runs it: tests/integration/test_default_job.py): ./test.sh's two workers then run two
# trainings at once on two cores without oversubscribing them (the default job at 2 threads beside another worker's
# training took ~3x as long as alone), and results are bitwise the same on any machine's core count. Set before
# torch is imported anywhere.
os.environ["OMP_NUM_THREADS"] = "1"  # not setdefault: a shell's own value would oversubscribe again


@pytest.fixture
def compose_cfg():
    """compose_cfg(*overrides) -> (DictConfig without the hydra node, choices)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from harness.config.store import register

    register(with_help=False)

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="harness"):
            cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg, choices

    return _compose


@pytest.fixture
def plan_of(compose_cfg, tmp_path):
    """plan_of(*overrides) -> Plan, with output_root under the test's tmp dir."""
    from harness.plan import build_plan

    def _plan(*overrides: str):
        cfg, choices = compose_cfg(f"output_root={tmp_path / 'out'}", *overrides)
        return build_plan(cfg, choices, [f"output_root={tmp_path / 'out'}", *overrides])

    return _plan


@pytest.fixture(scope="session")
def hub_snapshot(tmp_path_factory):
    """hub_snapshot(family="qwen2_5_vl") -> a hub-layout checkpoint with random tiny weights
    (harness.models.snapshot), built once per family and pytest session; tests that change one copy it."""
    from harness.models.snapshot import build_snapshot

    built: dict[str, Path] = {}

    def _get(family: str = "qwen2_5_vl") -> Path:
        if family not in built:
            built[family] = build_snapshot(tmp_path_factory.mktemp("snapshots") / family, family=family)
        return built[family]

    return _get


PINNED = {"OMP_NUM_THREADS": "1"}  # the same kernels in every launch: bitwise comparisons hold on any machine


class TinyRuns:
    """The default pipeline at debug=tiny (a 60-step SFT warm start, then grpo for ~8 steps, a checkpoint every 2),
    trained once per pytest session with pinned threads and data and model caches of its own: the reference every
    interrupted, paused or damaged run must equal, and the warm start they copy instead of training it again.
    Tests read it and never change it: `case` and `copy` give a test its own output_root."""

    ARGS = ("debug=tiny",)

    def __init__(self, root: Path):
        self.root = root
        self.cache_root = root / "cache"
        self.cache = [f"data.cache_dir={self.cache_root}/data", f"model.cache_dir={self.cache_root}/models"]
        self.straight = root / "straight"
        proc = self.run(self.straight)
        assert proc.returncode == 0, proc.stderr[-4000:]
        self.stderr = proc.stderr
        self.sft, self.grpo = run_dir_of(self.straight, "sft"), run_dir_of(self.straight, "grpo")

    def run(self, out: Path, *extra: str, fault: str | None = None, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        """`python -m harness debug=tiny output_root=OUT <the caches> EXTRA` with pinned threads (`fault`: a
        harness.faults spec, HARNESS_FAULT)."""
        full = {**PINNED, **({"HARNESS_FAULT": fault} if fault else {}), **(env or {})}
        return run_harness(*self.ARGS, f"output_root={out}", *self.cache, *extra, timeout=timeout, env=full)

    def case(self, out: Path, with_parent: bool = True) -> Path:
        """A fresh output_root holding a copy of the completed warm start (unless the case is about the warm start):
        a debug=tiny grpo, papo or evi_po run there trains only its RL part."""
        out.mkdir(parents=True, exist_ok=True)
        if with_parent:
            shutil.copytree(self.sft, out / "runs" / self.sft.name)
        return out

    def copy(self, out: Path) -> Path:
        """A copy of the whole finished output_root (warm start and grpo run) that a test may change."""
        shutil.copytree(self.straight, out)
        return out

    def assert_same(self, out: Path, arms: tuple[str, ...] = ("grpo",)) -> None:
        """The runs of `arms` under `out` finished and equal this session's uninterrupted ones: verify clean, the
        same final weights, logged values, optimizer steps, ledger tokens and trace rewards (loss tokens for sft)."""
        import json

        from harness.accounting.logs import read_rows
        from harness.verify import verify

        for arm in arms:
            a, b = (self.grpo, run_dir_of(out, "grpo")) if arm == "grpo" else (self.sft, run_dir_of(out, "sft"))
            assert verify(b) == [], verify(b)
            assert json.loads((b / "run_manifest.json").read_text())["status"] == "completed"
            assert (b / "final_policy/model.safetensors").read_bytes() == \
                (a / "final_policy/model.safetensors").read_bytes(), f"{arm}: the final weights differ"
            assert logged_values(b) == logged_values(a), f"{arm}: the logged values differ"
            steps = [r["step"] for r in read_rows(b / "metrics.jsonl")]
            assert steps == sorted(set(steps)), f"{arm}: lost or duplicated metrics rows {steps}"
            ca, cb = (json.loads((d / "completion.json").read_text()) for d in (a, b))
            assert cb["optimizer_steps"] == ca["optimizer_steps"]
            if arm == "grpo":
                for log, key in (("ledgers", "tokens"), ("traces", "reward")):
                    rows = lambda d: [(r["completion_id"], r[key]) for r in read_rows(d / f"{log}/rank-0.jsonl")]  # noqa: E731
                    assert rows(b) == rows(a), f"{log} differ"
                assert cb["realized_completion_tokens"] == ca["realized_completion_tokens"]
            else:
                assert cb["realized_loss_tokens"] == ca["realized_loss_tokens"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyRuns:
    """This session's debug=tiny pipeline (TinyRuns), trained on first use (~19 s here)."""
    return TinyRuns(tmp_path_factory.mktemp("tiny"))


def resume_decision(plan, run: Path, ahead=None):
    """What a run resumes from in the end (harness.run.recipe.Run without its training): find, then the
    deep check it left to the thread (ResumePoint.confirm, which the run calls after the loads), and find again
    when that check finds the chosen checkpoint damaged."""
    from harness.run.stages.resume import CheckpointDamaged, find

    point = find(plan, run, ahead)
    try:
        point.confirm()
    except CheckpointDamaged:
        point = find(plan, run, ahead)
        assert not point.unchecked, point  # the thread is done: the second decision is exact
    return point


def run_dir_of(out: Path, arm: str) -> Path:
    """The one run dir of `arm` under output_root `out`."""
    (d,) = [p for p in (out / "runs").iterdir() if p.name.startswith(arm + "-")]
    return d


def _run_env(env: dict | None) -> dict[str, str]:
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return full_env


_FORK = {"server": None, "lock": threading.Lock()}


def _fork_server(env: dict[str, str], args: tuple[str, ...] = ()):
    """This pytest process's preloaded interpreter (tests/forkserver.py), when it can run a process with `env`
    as a fresh interpreter would; None when off (HARNESS_TEST_FORKSERVER=0) or when `env` differs from the server's
    in what the preloaded packages read as they import."""
    if os.environ.get("HARNESS_TEST_FORKSERVER", "1") == "0":
        return None
    with _FORK["lock"]:
        if _FORK["server"] is None:
            import atexit

            from tests.forkserver import Server

            _FORK["server"] = Server(_run_env(None))
            atexit.register(_FORK["server"].stop)
    server = _FORK["server"]
    return server if server.accepts(env, args) else None


def run_harness(*args: str, module: str = "harness", cwd: Path | None = None, timeout: float = 120,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> args...` as a user would run it, with its output captured; `env` values of None unset a
    variable. It runs as a fork of this process's preloaded interpreter where that is the same as a fresh one
    (tests/forkserver.py: the ~9 s of importing torch, transformers and TRL paid once), else as a subprocess."""
    full_env = _run_env(env)
    server = _fork_server(full_env, args)
    if server is not None:
        return server.run(module, list(args), Path(cwd or REPO), full_env, timeout)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def signal_harness(*args: str, when: str, signals: tuple[int, ...], env: dict | None = None,
                   timeout: float = 300) -> tuple[int, str]:
    """`python -m harness args...` until a stderr line contains `when`, then `signals` sent to it 50 ms apart;
    (its exit code, its whole stderr) once it exits."""
    import time

    full_env = {**os.environ, **(env or {})}
    full_env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=REPO, env=full_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if when in line:
                for i, sig in enumerate(signals):
                    if i:
                        time.sleep(0.05)
                    proc.send_signal(sig)
                break
        seen.append(proc.stderr.read())
    finally:
        proc.wait(timeout=timeout)
    return proc.returncode, "".join(seen)


def logged_values(run_dir: Path) -> list[dict]:
    """metrics.jsonl without its wall-clock fields: what two runs of the same config must log identically."""
    from harness.accounting.logs import METRICS_PATH, read_rows

    return [{k: v for k, v in r.items() if "time" not in k and "per_second" not in k}
            for r in read_rows(run_dir / METRICS_PATH)]


HEAVY = ("torch", "transformers", "trl", "peft", "accelerate")


def heavy_imports(importtime_stderr: str) -> list[str]:
    """Top-level heavy packages named in `python -X importtime` output."""
    found = set()
    for line in importtime_stderr.splitlines():
        if "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name.split(".")[0] in HEAVY:
                found.add(name.split(".")[0])
    return sorted(found)


def pytest_configure(config):
    """The compose cache (harness/config/compose_cache.py) of this session in a temp dir, never the user's
    ~/.cache: set in os.environ before any test runs, so the subprocesses tests start (run_harness passes the
    environment on) use it too. Removed at the end of the session."""
    import tempfile

    config._harness_cache_dir = tempfile.mkdtemp(prefix="harness-test-cache-")
    os.environ["HARNESS_CACHE_DIR"] = config._harness_cache_dir


def pytest_unconfigure(config):
    import shutil

    d = getattr(config, "_harness_cache_dir", None)
    if d:
        shutil.rmtree(d, ignore_errors=True)
        if os.environ.get("HARNESS_CACHE_DIR") == d:
            del os.environ["HARNESS_CACHE_DIR"]


def pytest_addoption(parser):
    parser.addoption("--run-first", action="append", default=[], metavar="PATH",
                     help="run the tests whose node id starts with PATH before the others, in the order given "
                          "(repeatable; the rest keep their order)")
    parser.addoption("--shuffle", type=int, default=None, metavar="SEED",
                     help="run the test files in a random order drawn from SEED, and each file's tests in a random "
                          "order too (every test must pass in any order); the seed is printed in the header")


def pytest_report_header(config):
    seed = config.getoption("--shuffle")
    return None if seed is None else f"--shuffle {seed}: files and the tests within each file in a random order"


def pytest_collection_modifyitems(config, items):
    """--shuffle's or --run-first's order; gpu tests need a visible CUDA device; network tests run only with
    HARNESS_NETWORK=1."""
    from harness.config.checks import cuda_visible

    seed = config.getoption("--shuffle")
    if seed is not None:  # by file, then within it: a module fixture is still built once per file
        import random

        rng, files = random.Random(seed), {}
        for item in items:
            files.setdefault(item.nodeid.split("::")[0], []).append(item)
        order = list(files)
        rng.shuffle(order)
        items[:] = [item for f in order for item in rng.sample(files[f], len(files[f]))]
    first = config.getoption("--run-first")
    if first:
        items.sort(key=lambda item: next((i for i, p in enumerate(first) if item.nodeid.startswith(p)), len(first)))
    has_gpu = cuda_visible()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (marker gpu)"))
        if "network" in item.keywords and os.environ.get("HARNESS_NETWORK") != "1":
            item.add_marker(pytest.mark.skip(reason="needs network access; set HARNESS_NETWORK=1 (marker network)"))


class SlurmCluster:
    """scripts/slurm_local.sh's two-node cluster on localhost (n1, n2; partitions debug, preemptible, and high)."""

    SCRIPT = REPO / "scripts" / "slurm_local.sh"

    def __init__(self):
        self.env = {"SLURM_CONF": self.client("env").stdout.strip().split("=", 1)[1]}
        os.environ.update(self.env)  # the tests' own squeue / scontrol / sbatch, and every harness they start

    def client(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.SCRIPT), *args], capture_output=True, text=True, timeout=timeout)

    def run(self, *cmd: str, check: bool = True) -> str:
        """A SLURM client command's stdout (squeue, scontrol, sbatch, scancel)."""
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, env={**os.environ, **self.env})
        if check and proc.returncode:
            raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout

    def job(self, job_id: str) -> dict:
        """`scontrol show job -o JOB` as a dict (JobState, Restarts, Reason, NodeList, ...); {} when scontrol does
        not answer this time (a busy controller: ask again)."""
        import re

        return dict(re.findall(r"(\w+)=(\S*)", self.run("scontrol", "show", "job", "-o", job_id, check=False)))

    def cancel_all(self) -> None:
        self.run("scancel", "--partition=debug,high", check=False)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The cluster of the `slurm` tests, brought up once per session (installing slurm-wlm and munge with apt when
    missing: needs root) and stopped at its end unless it was up before. Where it cannot come up the tests skip
    with the reason; with HARNESS_REQUIRE_SLURM=1 (.ci/run) they fail instead."""
    was_up = SlurmCluster.SCRIPT.exists() and subprocess.run(
        [str(SlurmCluster.SCRIPT), "status"], capture_output=True, timeout=60).returncode == 0
    if not was_up:
        proc = subprocess.run([str(SlurmCluster.SCRIPT), "up"], capture_output=True, text=True, timeout=900)
        if proc.returncode:
            why = f"scripts/slurm_local.sh up failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}"
            if os.environ.get("HARNESS_REQUIRE_SLURM") == "1":
                pytest.fail(why)
            pytest.skip(why)
    cluster = SlurmCluster()
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        if not was_up:
            cluster.client("down", timeout=300)


def wandb_run_record(path: Path) -> dict:
    """What a W&B offline run file (`run-<id>.wandb`, LevelDB-log framed protobuf records) says of the run: name,
    group, tags, top-level config keys, the summary (JSON-decoded) and the exit code."""
    import json

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf = path.read_bytes(), 7, 32768, b""  # a 7-byte file header, then 32 KiB blocks
    out = {"config_keys": [], "summary": {}, "exit_code": None}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk  # FULL, FIRST | MIDDLE, LAST
        if kind not in (1, 4):
            continue
        r = pb.Record()
        r.ParseFromString(buf)
        which = r.WhichOneof("record_type")
        if which == "run":
            out.update(name=r.run.display_name, group=r.run.run_group, tags=list(r.run.tags))
            out["config_keys"] += [i.key for i in r.run.config.update]
        elif which == "summary":
            out["summary"].update({i.key: json.loads(i.value_json) for i in r.summary.update})
        elif which == "exit":
            out["exit_code"] = r.exit.exit_code
    return out
