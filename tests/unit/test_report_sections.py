"""The reviewer's statistics in `python -m harness.report` (harness.report.analysis): fixture run dirs with chosen
per-view predictions and eval curves; report.json and report.md checked against hand-worked values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.report.cli import build_report, main
from harness.report.itemstats import hierarchical_bootstrap, item_differences
from harness.metrics import RELATIONS
from harness.report.power import needed
from tests.unit.test_report import make_run

VIEWS = 40  # 10 per relation
GRPO = (20, 24, 28)  # views right per seed (of 40): accuracy 0.5, 0.6, 0.7
PAPO = (22, 23, 29)  # 0.55, 0.575, 0.725: differences +0.05, -0.025, +0.025 (the interval over seeds holds 0)
PERIODIC = {"grpo": {4: (200, 0.45), 8: (400, 0.55)}, "papo": {4: (200, 0.5), 8: (400, 0.6)}}


def _view(i: int) -> str:
    return f"b{i:03d}:{RELATIONS[i % 4].lower()}"


def write_predictions(run_dir, right: int) -> None:
    """eval/test.predictions.jsonl: views ordered by difficulty (the same order in every run), the first `right`
    answered correctly; view i has relation RELATIONS[i % 4]. Written in reverse: pairing is by view id."""
    rows = [{"view": _view(i), "relation": RELATIONS[i % 4], "correct": i < right, "prediction": "x", "gold": "x"}
            for i in reversed(range(VIEWS))]
    (run_dir / "eval" / "test.predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _scores(right: int, relation: str | None = None) -> dict[str, float]:
    return {_view(i): float(i < right) for i in range(VIEWS) if relation is None or RELATIONS[i % 4] == relation}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections") / "out"
    sft = [make_run(root, "sft", s, 0.40 + 0.01 * s, steps=20) for s in range(3)]
    for arm, right, knobs in (("grpo", GRPO, None), ("papo", PAPO, {"gamma": 0.02})):
        for s in range(3):
            run = make_run(root, arm, s, right[s] / VIEWS, before=0.40 + 0.01 * s, parent=sft[s].name, knobs=knobs,
                           periodic=PERIODIC[arm])
            write_predictions(run, right[s])
    rep, md = build_report(root)
    return root, rep, md.read_text()


def _pair(rep, metric: str) -> dict:
    return next(p for p in rep["groups"][0]["paired"] if p["condition"] == "papo" and p["metric"] == metric)


def test_per_item_interval_beside_the_per_seed_one(report):
    _, rep, md = report
    p = _pair(rep, "eval/accuracy")
    assert p["diffs"] == [pytest.approx(0.05), pytest.approx(-0.025), pytest.approx(0.025)]
    assert p["low"] <= 0 <= p["high"]  # exact per-seed bootstrap, 3 seeds: [min, max] = [-0.025, 0.05]
    item = p["item"]
    # seed s's views paired by id: the per-item mean difference is the per-seed one, (2 - 1 + 1) / 40 / 3
    assert item["mean"] == pytest.approx(p["mean"]) == pytest.approx(2 / 40 / 3)
    assert item["seeds"] == [0, 1, 2] and item["n_items"] == [40, 40, 40]
    want = hierarchical_bootstrap([_scores(r) for r in PAPO], [_scores(r) for r in GRPO])
    assert (item["low"], item["high"]) == (want["low"], want["high"])
    full = _pair(rep, "eval/FULL/accuracy")["item"]  # FULL views only: i = 0, 4, ..., 36
    assert full["n_items"] == [10, 10, 10] and (full["low"], full["high"]) == pytest.approx(
        [hierarchical_bootstrap([_scores(r, "FULL") for r in PAPO], [_scores(r, "FULL") for r in GRPO])[k]
         for k in ("low", "high")])
    assert _pair(rep, "eval/format_valid")["item"] is None  # not a mean over views scored right / wrong
    assert "95% interval per item (seeds, then views)" in md and "(3 seeds × 40 views)" in md


def test_seeds_and_views_needed_where_not_distinguishable(report):
    _, rep, md = report
    p = _pair(rep, "eval/accuracy")
    seeds = needed([0.05, -0.025, 0.025])  # mean 0.01667, sd 0.03819: effect 0.436 -> 44 seeds
    assert p["power"]["seeds"]["needed"] == seeds["needed"] == 44
    views = needed(item_differences([_scores(r) for r in PAPO], [_scores(r) for r in GRPO]))
    assert p["power"]["items"]["needed"] == views["needed"] and views["n"] == 40
    assert "**Not distinguishable**" in md
    row = next(line for line in md.splitlines() if line.startswith("| papo | accuracy | +0.017 | 0.038 |"))
    assert row == f"| papo | accuracy | +0.017 | 0.038 | 3 | 44 | contains 0 | {views['needed']:,} |"
    assert "| papo | format valid |" not in md.split("**Not distinguishable**")[1]  # 0 on every seed: nothing to detect


def test_robust_aggregates_by_hand(report):
    _, rep, md = report
    r = {c["condition"]: c for c in rep["groups"][0]["robust"]["conditions"]}
    # n = 3: the IQM trims floor(3/4) = 0 runs, the mean; strata: the relations (each run's relations rebuild it)
    assert r["grpo"]["iqm"]["iqm"] == pytest.approx(0.6) and r["grpo"]["strata"] == list(RELATIONS)
    # papo .55, .575, .725 over grpo .5, .6, .7: .55 beats 1; .575 beats 1; .725 beats 3 -> 5 / 9
    assert r["papo"]["improvement"]["p"] == pytest.approx(5 / 9)
    assert r["grpo"]["improvement"] is None and r["sft (warm start)"]["improvement"] is None  # baseline; unpaired
    assert "Robust aggregates over seeds (rliable)" in md and "| papo | 3 | 0.617 |" in md
    assert (report[0] / "report" / "performance_profile.png").is_file()
    assert rep["groups"][0]["plots"]["performance_profile"]["file"] == "performance_profile.png"


def test_efficiency_by_hand(report):
    _, rep, md = report
    e = rep["groups"][0]["efficiency"]
    assert e["range"] == [0.0, 500.0]  # every run: 10 steps x 50 tokens
    # threshold: init 0.41 (every RL run's eval before), best final papo 0.61667: 0.41 + (0.61667 - 0.41) / 2
    tau = 0.41 + (np.mean([r / VIEWS for r in PAPO]) - 0.41) / 2
    assert e["threshold"] == pytest.approx(tau)
    g = next(c for c in e["conditions"] if c["condition"] == "grpo")
    # seed 0: (0, .40) (200, .45) (400, .55) (500, .50): 85 + 100 + 52.5 = 237.5 / 500
    assert g["auc"]["values"][0] == pytest.approx(0.475)
    assert g["auc"]["mean"] == pytest.approx((237.5 + 243.5 + 249.5) / 3 / 500)
    # seed 0 reaches tau between 200 (.45) and 400 (.55)
    assert g["tokens_to_threshold"]["values"][0] == pytest.approx(200 + (tau - 0.45) / 0.10 * 200)
    assert g["tokens_to_threshold"]["reached"] == 3 and g["fit"]["points"] == 4
    assert g["fit"]["identifiable"] or g["fit"]["reason"]
    assert [c["condition"] for c in e["conditions"]] == ["grpo", "papo"]  # RL conditions only
    assert "Efficiency per sampled token" in md and f"tokens to {tau:.3f}" in md


def test_threshold_option(report, capsys):
    root = report[0]
    rep, _ = build_report(root, out=root / "r2", threshold=0.5)
    assert rep["groups"][0]["efficiency"]["threshold"] == 0.5
    assert rep["groups"][0]["efficiency"]["threshold_rule"].startswith("given")
    assert main([str(root), "--threshold", "1.5", "--out", str(root / "r3")]) == 2
    assert "--threshold 1.5" in capsys.readouterr().err


def test_an_identifiable_fit_is_rendered_with_its_intervals():
    from harness.report.efficiency import fit_scalerl
    from harness.report.render_stats import efficiency_section
    from tests.unit.test_report_efficiency import _curves

    fit = fit_scalerl(_curves(0.3, 0.8, 1.5, 20_000.0))
    assert fit["identifiable"]
    row = {"condition": "grpo", "seeds": [0, 1, 2, 3, 4], "auc": {"n": 5, "mean": 0.6, "half_width": 0.02},
           "tokens_to_threshold": {"values": [9000.0, None], "reached": 1, "n": 2, "summary": None}, "fit": fit}
    md = "\n".join(efficiency_section({"efficiency": {"range": [0.0, 80_000.0], "threshold": 0.55,
                                                      "threshold_rule": "given", "init_accuracy": 0.3,
                                                      "conditions": [row]}}, "##"))
    (alo, ahi), (blo, bhi) = fit["A_interval"], fit["B_interval"]
    assert (f"| grpo | 0.600 ± 0.020 (n=5) | 1 of 2 reached: 9,000, not reached | {fit['A']:.3f} [{alo:.3f}, "
            f"{ahi:.3f}] | {fit['B']:.2f} [{blo:.2f}, {bhi:.2f}] | C_mid {fit['C_mid']:,.0f} tokens, R0 "
            f"{fit['R0']:.3f} |") in md, md
