"""bench/plan.py's torch check: its wrapper reports the modules `python -m harness mode=plan` imported (one
subprocess), and that list holds no torch, transformers or trl."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _bench_plan():
    spec = importlib.util.spec_from_file_location("bench_plan", REPO / "bench" / "plan.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_torch_imported_reads_module_names():
    b = _bench_plan()
    assert b.torch_imported(["torch"]) and b.torch_imported(["torch._C", "hydra"]) and b.torch_imported(["torchvision"])
    assert not b.torch_imported([]) and not b.torch_imported(["transformers_stub", "omegaconf"])


def test_mode_plan_imports_no_heavy_module(tmp_path):
    b = _bench_plan()
    assert b.heavy_modules(b.plan_argv(str(tmp_path / "out"), [])) == []
    assert not (tmp_path / "out").exists()
