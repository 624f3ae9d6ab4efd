"""The GPU check's dry run on CPU (`scripts/gpu_check.sh --cpu`): the whole shape of the check the GPU node runs,
so a broken command line, collector or report is found here and not on the node's short lease. A few minutes on
2 cores; every part must end with a status, and every part that can run on CPU must pass."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

PARTS = ("env", "arms_tiny", "arms_fixture", "parity", "qwen3b")


def test_cpu_dry_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), "--cpu", "--out", str(out), "--work",
                           str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert (out / "gpu_check.log").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["mode"] == "cpu" and set(report["parts"]) == set(PARTS)
    for name, part in report["parts"].items():
        assert part["status"] in ("ok", "skipped", "failed", "timeout"), (name, part["status"])
        for step, rec in part["steps"].items():
            assert rec["status"] in ("ok", "skipped", "failed", "timeout"), (step, rec)
    failed = {n: p["steps"] for n, p in report["parts"].items() if p["status"] not in ("ok", "skipped")}
    assert proc.returncode == 0 and not failed, (proc.stdout[-4000:], failed)
    figures = {n: p["figures"] for n, p in report["parts"].items()}
    for part in ("arms_tiny", "arms_fixture"):
        assert set(figures[part]["runs"]) == {"sft", "grpo", "papo", "evi_po", "opd"}
        assert all(r["verify"] == "ok" and r["optimizer_steps"] > 0 for r in figures[part]["runs"].values())
    assert figures["arms_tiny"]["smoke"]["passed"]
    assert figures["arms_fixture"]["full"]["tuning"] == "full"
    runs = figures["qwen3b"]["runs"]
    assert set(runs) == {"grpo-lora", "papo-lora", "grpo-lora-bare", "grpo-full", "papo-full"}
    for name, run in runs.items():
        assert run["ok"] and run["wall_s_per_step"] > 0 and run["wall_tokens_per_s"] > 0, (name, run)
        assert run["checkpoint_save_s"], name  # the final checkpoint's save was timed
    assert figures["qwen3b"]["harness_over_bare"]["wall_step"] > 0
    parity = report["parts"]["parity"]
    assert parity["status"] == "ok" or parity["steps"]["parity"]["reason"].startswith("no torchvision")
    text = (out / "gpu_check.log").read_text()
    assert "== gpu_check (cpu;" in text and "PASSED" in text
