"""A comparison is bound by the token budget, not by max_steps: the named comparison's real multirun sweep
(sweep=arms_x_seeds debug=tiny: grpo, papo, evi_po x 3 seeds, and their warm starts), every RL run stopped by its
budget at a step whose successor could have overflowed it, realized tokens within one generation round's bound of
each other, and the report's verdict saying so per run (the budget stop of each arm alone: tests/unit/test_budget.py,
test_opd_train). Before: debug=tiny capped every run at max_steps=8 with 38-82% of its
budget used, so no run of the suite was ever stopped by the budget.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.accounting.logs import read_rows
from harness.accounting.checkpoint import CHECKPOINT_MANIFEST, complete_checkpoints
from harness.verify import verify
from tests.conftest import run_harness


def _sweep(out: Path, *args: str):
    proc = run_harness("-m", *args, "debug=tiny", "train.eval_before=false", f"output_root={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (sweep_dir,) = (out / "sweeps").iterdir()
    jobs = json.loads((sweep_dir / "sweep.json").read_text())
    return sweep_dir, [Path(r["run_dir"]) for r in jobs["runs"]], proc


def _check_budget_bound(runs: list[Path]) -> list[int]:
    tokens = []
    for run in runs:
        comp = json.loads((run / "completion.json").read_text())
        if comp["arm"] == "sft":
            continue
        plan = json.loads((run / "run_manifest.json").read_text())["plan"]
        bound, ceiling = plan["budget"]["generation_round"]["token_bound"], comp["completion_token_ceiling"]
        assert comp["stopped_by"] == "budget", (run.name, comp["optimizer_steps"], comp["realized_completion_tokens"])
        assert comp["optimizer_steps"] < plan["budget"]["max_steps"]
        used = comp["realized_completion_tokens"]
        assert ceiling - bound < used <= ceiling, "stopped although the next step fitted, or overspent"
        per_step = Counter()
        for r in read_rows(run / "ledgers/rank-0.jsonl"):
            per_step[r["step"]] += r["tokens"]
        assert sum(per_step.values()) == used and max(per_step) == comp["optimizer_steps"] - 1
        final = json.loads((complete_checkpoints(run)[-1] / CHECKPOINT_MANIFEST).read_text())
        assert final["permanent"] and final["step"] == comp["optimizer_steps"] and final["totals"]["stopped_by_budget"]
        assert verify(run) == []
        tokens.append(used)
    return tokens


@pytest.mark.slow
def test_the_named_comparison_is_budget_bound_in_its_debug_form(tmp_path):
    """The acceptance command: `python -m harness -m sweep=arms_x_seeds debug=tiny` (12 jobs)."""
    sweep_dir, runs, _ = _sweep(tmp_path, "sweep=arms_x_seeds")
    tokens = _check_budget_bound(runs)
    assert len(tokens) == 9  # grpo, papo, evi_po x 3 seeds (sft has a loss-token budget)
    bound = json.loads((runs[-1] / "run_manifest.json").read_text())["plan"]["budget"]["generation_round"]["token_bound"]
    assert max(tokens) - min(tokens) <= bound  # every run within one generation round of the others
    rep = run_harness(str(sweep_dir), module="harness.report", timeout=120)
    assert rep.returncode == 0 and "budget-bound: yes" in rep.stdout, rep.stdout + rep.stderr
    report = json.loads((sweep_dir / "report" / "report.json").read_text())
    rows = [r for g in report["groups"] for r in g["budget_runs"] if r["arm"] != "sft"]
    assert sorted(r["stopped_by"] for r in rows) == ["budget"] * 9
    assert (sweep_dir / "report" / "report.md").read_text().count("| budget |") == 9
    # the warm starts (60 steps of a 188-step epoch) say what cut their epoch prefix: max_steps
    parents = {json.loads((r / "run_manifest.json").read_text())["parent"]["run_dir"] for r in runs
               if not r.name.startswith("sft-")}
    warm = [json.loads((Path(p) / "completion.json").read_text()) for p in parents]
    assert len(warm) == 3 and all(c["stopped_by"] == "max_steps" and c["stopped_by_source"] == "sft_prefix"
                                  for c in warm)
