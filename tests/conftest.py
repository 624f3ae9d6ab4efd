"""Shared fixtures: one Hydra compose fixture for every config test, and subprocess helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


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


def run_harness(*args: str, module: str = "harness", cwd: Path | None = None, timeout: float = 120,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m <module> args...` in a subprocess, as a user would run it; `env` values of None unset a variable."""
    full_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    full_env.pop("HYDRA_FULL_ERROR", None)
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
    parser.addoption("--start-by", type=float, default=None, metavar="UNIX_TIME",
                     help="skip, with the reason, every test not started by this time (.ci/run keeps the slow tests "
                          "inside CI's time limit with it; ./test.sh -m slow runs them all)")
    parser.addoption("--run-first", action="append", default=[], metavar="PATH",
                     help="run the tests whose node id starts with PATH before the others, in the order given "
                          "(repeatable; the rest keep their order)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under --start-by, a test whose turn comes after that time is skipped before its fixtures are built."""
    start_by = item.config.getoption("--start-by")
    if start_by is not None and time.time() > start_by:
        pytest.skip(f"not started: CI's time for the slow tests had run out (--start-by); ./test.sh -m slow runs "
                    f"{item.nodeid}")


def pytest_collection_modifyitems(config, items):
    """--run-first's order; gpu tests need a visible CUDA device; network tests run only with HARNESS_NETWORK=1."""
    from harness.config.checks import cuda_visible

    first = config.getoption("--run-first")
    if first:
        items.sort(key=lambda item: next((i for i, p in enumerate(first) if item.nodeid.startswith(p)), len(first)))
    has_gpu = cuda_visible()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (marker gpu)"))
        if "network" in item.keywords and os.environ.get("HARNESS_NETWORK") != "1":
            item.add_marker(pytest.mark.skip(reason="needs network access; set HARNESS_NETWORK=1 (marker network)"))


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
