"""A comparison that carries no signal says so (issue: a new user's first debug=tiny comparison), and the report
stays readable when conditions coincide or seeds are few: fixture run dirs (tests/unit/test_report.py's make_run)
with chosen numbers; the run's console summary (harness.run.lifecycle._summary) with a chosen completion.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.report.cli import build_report
from tests.unit.test_report import RELS, _cond, _write, make_run


def abstaining(n_per_rel: int = 16) -> dict:
    """An eval block whose policy answered the abstention on every view (accuracy = the MISSING share)."""
    rel = {r: {"n": n_per_rel, "accuracy": 1.0 if r == "MISSING" else 0.0, "abstention_rate": 1.0,
               "format_valid": 1.0, "truncated": 0.0} for r in RELS}
    return {"n": 4 * n_per_rel, "accuracy": 0.25, "abstention_rate": 1.0, "format_valid": 1.0, "truncated": 0.0,
            "per_relation": rel}


def set_eval(run: Path, block: dict, label: str = "final") -> None:
    """Replace a fixture run's final (or before) eval: its artifact and completion.json's copy."""
    name = "test.json" if label == "final" else "test-before.json"
    _write(run / "eval" / name, {"split": "test", "label": label, **block})
    comp = json.loads((run / "completion.json").read_text())
    comp["eval_after" if label == "final" else "eval_before"] = block
    _write(run / "completion.json", comp)


def set_config(run: Path, **budget) -> None:
    """Put budget fields (sft_warm_start_steps, ...) and debug=tiny into a fixture run's plan."""
    m = json.loads((run / "run_manifest.json").read_text())
    m["plan"]["config"]["budget"].update(budget)
    m["plan"]["config"]["arm"]["init"] = "sft"
    m["plan"]["choices"]["debug"] = "tiny"
    _write(run / "run_manifest.json", m)


def new_user(root: Path, rewards_papo: list[float] | None = None, abstain: bool = True, seeds=(0, 1)) -> Path:
    """`-m arm=grpo,papo seed=0,1 debug=tiny` as the output_root holds it: two SFT warm starts and, from them, grpo
    and papo with the same tokens and rewards (papo's rewards: `rewards_papo`); every eval abstains."""
    rewards = [-0.5, 0.0, 0.1, -0.1, 0.2, 0.0, 0.1, -0.016]
    for s in seeds:
        sft = make_run(root, "sft", s, 0.25, steps=60)
        runs = [sft, make_run(root, "grpo", s, 0.25, before=0.25, parent=sft.name, steps=8, rewards=rewards,
                              ceiling=2048, stopped_by="budget"),
                make_run(root, "papo", s, 0.25, before=0.25, parent=sft.name, steps=8, knobs={"gamma": 0.02},
                         rewards=rewards_papo or rewards, ceiling=2048, stopped_by="budget")]
        for r in runs:
            set_config(r, sft_warm_start_steps=60, max_completion_tokens=2048)
            if abstain:
                set_eval(r, abstaining())
                if not r.name.startswith("sft"):
                    set_eval(r, abstaining(), "before")
    return root


# --- 1a: a policy that abstains on every view


def test_a_policy_that_abstains_on_every_view_is_flagged_with_the_fix(tmp_path, capsys):
    from harness.report.cli import main

    root = new_user(tmp_path / "o")
    rep, md = build_report(root)
    sig = rep["groups"][0]["signal"]
    assert [a["condition"] for a in sig["abstains_everywhere"]] == ["sft (warm start)", "grpo", "papo"]
    assert all(a["every_seed"] and a["seeds"] == [0, 1] for a in sig["abstains_everywhere"])
    assert sig["no_signal"] is True
    (w,) = [w for w in sig["warnings"] if w["kind"] == "abstains_everywhere"]
    assert w["headline"] == ("the policy abstains on every eval view in every run of `sft (warm start)`, `grpo` "
                             "and `papo`")
    assert "accuracy 0.250 is only the share of MISSING views" in w["text"]
    assert "budget.sft_warm_start_steps (now 60)" in w["fix"] and "budget.sft_warm_start_epochs" in w["fix"]
    assert "budget.max_completion_tokens (now 2,048)" in w["fix"]
    text = md.read_text()
    assert f"> **No signal: {w['headline']}.**" in text and w["fix"] in text
    assert text.index("No signal") < text.index("## Eval accuracy")  # read first
    assert main([str(root)]) == 0
    out = capsys.readouterr().out
    assert f"NO SIGNAL: {w['headline']}." in out and f"  {w['fix']}" in out


def test_a_policy_that_answers_is_not_flagged_and_one_abstaining_seed_is_named(tmp_path):
    root = new_user(tmp_path / "o", abstain=False)
    rep, md = build_report(root)
    assert rep["groups"][0]["signal"]["abstains_everywhere"] == [] and "abstains on every" not in md.read_text()
    # accuracy 0.25 with an abstention rate below 1 is not the rule (a policy that answers can score the MISSING share)
    near = abstaining()
    near["abstention_rate"] = 0.98
    near["per_relation"]["FULL"]["abstention_rate"] = 0.9375
    run = next((root / "runs").glob("grpo-*-s1-*"))
    set_eval(run, near)
    assert build_report(root)[0]["groups"][0]["signal"]["abstains_everywhere"] == []
    set_eval(run, abstaining())
    sig = build_report(root)[0]["groups"][0]["signal"]
    (a,) = sig["abstains_everywhere"]
    assert a["condition"] == "grpo" and a["seeds"] == [1] and not a["every_seed"]
    assert "in seed 1 of `grpo`" in sig["warnings"][0]["headline"]


def _summary_lines(caplog, comp: dict, rl: bool = True, init: str = "sft") -> str:
    from harness.run.lifecycle import _summary

    from harness import kinds

    from omegaconf import OmegaConf

    from harness.config.compose import compose

    cfg, _ = compose(["arm=grpo" if rl else "arm=sft", *([f"arm.init={init}"] if rl else []),
                      "budget.max_completion_tokens=2048", "budget.sft_warm_start_steps=60", "budget.max_steps=64"])
    plan = SimpleNamespace(kind=kinds.of("rl" if rl else "sft"), run_dir="/o/runs/grpo-x", cfg=OmegaConf.to_object(cfg))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="harness"):
        _summary(plan, comp)
    return "\n".join(r.getMessage() for r in caplog.records)


def _completion(after: dict, before: dict | None = None, start: dict | None = None) -> dict:
    return {"arm": "grpo", "optimizer_steps": 8, "realized_completion_tokens": 1553, "completion_token_ceiling": 2048,
            "stopped_by": "budget", "eval_after": {"split": "test", **after}, "eval_before": before or {},
            "phases_s": {"parent": 73.5, "imports": 0.0, "train": 6.1},
            "start_phases_s": start or {"parent": 73.5, "imports": 73.5, "first_step": 75.1}}


def test_the_run_console_summary_flags_a_policy_that_abstains_on_every_view(caplog):
    text = _summary_lines(caplog, _completion(abstaining(), abstaining()))
    assert "NO SIGNAL: the policy answers the abstention (\"unknown\") on every one of the 64 test views" in text
    assert "Its init (the eval before training) abstained on every view too." in text
    assert "budget.sft_warm_start_steps (now 60)" in text and "budget.max_completion_tokens (now 2,048)" in text
    scratch = _summary_lines(caplog, _completion(abstaining()), init="scratch")
    assert "arm.init=sft" in scratch and "Its init" not in scratch
    answers = abstaining()
    answers["abstention_rate"] = 0.5
    assert "NO SIGNAL" not in _summary_lines(caplog, _completion(answers))


# --- 1b: conditions that cannot be told apart


def test_conditions_with_identical_accuracy_tokens_and_reward_are_said_to_carry_no_signal(tmp_path, capsys):
    from harness.report.cli import main

    root = new_user(tmp_path / "o", abstain=False)
    rep, md = build_report(root)
    (same,) = rep["groups"][0]["signal"]["indistinguishable"]
    assert same["conditions"] == ["grpo", "papo"] and same["seeds"] == [0, 1]
    assert same["metrics"] == ["eval/accuracy", "budget/tokens", "train/reward_last10pct"]
    (w,) = [w for w in rep["groups"][0]["signal"]["warnings"] if w["kind"] == "indistinguishable"]
    assert w["headline"] == "`grpo` and `papo` cannot be told apart"
    for what in ("eval accuracy 0.250 / 0.250", "realized tokens 400 / 400", "train reward", "-0.016 / -0.016",
                 "carries no signal: their runs produced the same numbers", "the cause is not a flat reward"):
        assert what in w["text"], what
    assert "at this size" not in w["text"] and "debug=tiny" not in w["text"]  # the model size is not a cause
    assert f"> **No signal: {w['headline']}.** {w['text']}" in md.read_text()
    assert main([str(root)]) == 0 and f"NO SIGNAL: {w['headline']}." in capsys.readouterr().out


def test_the_no_signal_note_names_the_cause_each_condition_measured(tmp_path):
    """Runs whose completion.json says the reward gave no update (harness.run.learning): the note says what each
    condition measured, seed by seed, instead of blaming the model size."""
    root = new_user(tmp_path / "o", abstain=False)
    flat = {"cause": "no_well_formed", "since_step": 1, "recovered_at": None, "completions": 64,
            "parser_errors": {"unbalanced_tags": 64}, "well_formed": 0.0, "correct": 0.0}
    for run in (root / "runs").iterdir():
        if run.name.startswith(("grpo", "papo")):
            comp = json.loads((run / "completion.json").read_text())
            found = flat if run.name.startswith("grpo") or "-s0-" in run.name else {
                **flat, "cause": "flat_groups", "since_step": 3, "recovered_at": 6, "well_formed": 0.5}
            comp["learning_signal"] = {"no_update": found}
            _write(run / "completion.json", comp)
    rep, _ = build_report(root)
    (w,) = [w for w in rep["groups"][0]["signal"]["warnings"] if w["kind"] == "indistinguishable"]
    assert ("Measured: `grpo` (seeds 0, 1): no update from the reward from step 1 to the end (not one well-formed "
            "answer: unbalanced_tags 100%); `papo` (seed 0): no update from the reward from step 1 to the end (not one "
            "well-formed answer: unbalanced_tags 100%); `papo` (seed 1): no update from the reward from step 3 until "
            "step 6 (every group's rewards equal; 50% well-formed, 0% correct).") in w["text"], w["text"]


def test_conditions_that_differ_in_one_metric_are_not_flagged(tmp_path):
    root = new_user(tmp_path / "o", abstain=False, rewards_papo=[-0.5, 0.0, 0.1, -0.1, 0.2, 0.0, 0.1, 0.3])
    rep, md = build_report(root)
    assert rep["groups"][0]["signal"]["indistinguishable"] == [] and "cannot be told apart" not in md.read_text()


# --- 2a: coinciding lines stay visible


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the report saves: {png name: (legend texts, [(label, linestyle, marker, lw, ydata) per line])}."""
    from harness.report import plots as P

    seen: dict[str, tuple] = {}
    save = P._save

    def spy(fig, path):
        legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        lines = [(ln.get_label(), ln.get_linestyle(), ln.get_marker(), ln.get_linewidth(), list(ln.get_ydata()))
                 for ax in fig.axes for ln in ax.get_lines()]
        titles = [ax.get_title() for ax in fig.axes]
        seen[path.name] = ([t.get_text() for lg in legends for t in lg.get_texts()], lines, titles)
        save(fig, path)

    monkeypatch.setattr(P, "_save", spy)
    return seen


def test_identical_curves_stay_visible_and_the_legend_says_they_coincide(tmp_path, drawn):
    root = tmp_path / "o"
    rows = [{"step": k, "reward": 0.1 * k, "loss": 0.5, "kl": 0.01 * k} for k in range(1, 11)]
    for s in range(2):
        for arm, knobs in (("grpo", None), ("papo", {"gamma": 0.02})):
            make_run(root, arm, s, 0.6, before=0.4, knobs=knobs, periodic={4: (200, 0.5)}, metrics_rows=rows)
    rep, _ = build_report(root)
    legend, lines, _ = drawn["reward_vs_tokens.png"]
    grpo, papo = (next(ln for ln in lines if ln[0].startswith(f"{a} (n=")) for a in ("grpo", "papo"))
    assert grpo[4] == papo[4]  # the same values: no offset
    assert grpo[1] != papo[1] and grpo[2] != papo[2] and grpo[3] > papo[3]  # style, marker; the first drawn wider
    assert any("lines of grpo and papo coincide" in t for t in legend)
    plots = rep["groups"][0]["plots"]
    assert plots["reward_vs_tokens"]["coincide"] == [["grpo", "papo"]]
    assert plots["accuracy_vs_tokens"]["coincide"]["overall"] == [["grpo", "papo"]]
    assert plots["diagnostics"]["coincide"]["reward"] == [["grpo", "papo"]]
    legend, _, titles = drawn["accuracy_vs_tokens.png"]
    assert any("lines of grpo and papo coincide" in t and "every panel" in t for t in legend)
    legend, _, titles = drawn["diagnostics.png"]
    assert any("lines of grpo and papo coincide" in t for t in legend) and "reward  [grpo = papo]" in titles


def test_different_curves_get_no_coincide_note(basic_rl, drawn):
    rep, _ = build_report(basic_rl)
    assert rep["groups"][0]["plots"]["reward_vs_tokens"]["coincide"] == []
    assert not any("coincide" in t for t in drawn["reward_vs_tokens.png"][0])


@pytest.fixture
def basic_rl(tmp_path):
    root = tmp_path / "o"
    for s in range(2):
        make_run(root, "grpo", s, 0.5, rewards=[0.1 * k for k in range(10)])
        make_run(root, "papo", s, 0.6, knobs={"gamma": 0.02}, rewards=[0.05 * k for k in range(10)])
    return root


# --- 2b: one footnote instead of a note in every cell


def test_two_seed_cells_show_the_mean_and_a_marker_with_one_footnote_per_table(tmp_path):
    root = new_user(tmp_path / "o", abstain=False)
    make_run(root, "evi_po", 0, 0.5)  # one seed
    _, md = build_report(root)
    text = md.read_text()
    assert "too few seeds for an interval" not in text
    evals = text[text.index("## Eval accuracy"):text.index("## Training and budget")]
    assert "| grpo | 0.250† | 0.250† | +0.000† |" in evals and "| evi_po | 0.500‡ |" in evals
    assert evals.count("† two seeds: the mean only") == 1 and evals.count("‡ one seed: its value") == 1
    training = text[text.index("## Training and budget"):text.index("## Budget per run")]
    assert "| grpo | sampled | -0.016† | 400† |" in training and training.count("† two seeds") == 1


# --- 2c: the SFT warm start is not paired against the RL baseline


def test_sft_conditions_are_not_paired_against_an_rl_baseline_unless_named_as_the_baseline(tmp_path):
    root = new_user(tmp_path / "o", abstain=False)
    rep, md = build_report(root)
    g = rep["groups"][0]
    assert {p["condition"] for p in g["paired"]} == {"papo"}
    (u,) = g["unpaired"]
    assert u["condition"] == "sft (warm start)" and u["baseline"] == "grpo"
    assert '--baseline "sft (warm start)"' in u["fix"]
    assert "Not paired: `sft (warm start)`" in md.read_text()
    # an explicit request: the warm start as the baseline pairs every RL condition against it
    for wanted in ("sft", "sft (warm start)"):
        rep2, _ = build_report(root, baseline=wanted)
        g2 = rep2["groups"][0]
        assert g2["baseline"] == "sft (warm start)" and g2["unpaired"] == []
        assert {p["condition"] for p in g2["paired"]} == {"grpo", "papo"}
        assert next(p for p in g2["paired"] if p["condition"] == "grpo" and p["metric"] == "eval/accuracy")["n"] == 2


# --- 2d: time to first step without the parent run first in the same process


def test_time_to_first_step_leaves_out_the_warm_start_run_first_in_the_same_process(tmp_path, caplog):
    root = tmp_path / "o"
    runs = {"grpo": (make_run(root, "grpo", 0, 0.5, before=0.4), 73.5, 75.1),  # its warm start ran first: 73.5 s
            "papo": (make_run(root, "papo", 0, 0.5, before=0.4), 0.0, 8.2)}   # its warm start was already there
    for arm, (run, parent, first) in runs.items():
        marks = {"parent": parent, "imports": parent, "first_step": first}
        m = json.loads((run / "run_manifest.json").read_text())
        m["start_phases"] = [{"pid": 1, "started_at": "t", "seconds": marks}]
        _write(run / "run_manifest.json", m)
        comp = json.loads((run / "completion.json").read_text())
        comp["start_phases_s"] = marks
        _write(run / "completion.json", comp)
    rep, md = build_report(root)
    assert _cond(rep, "grpo")["metrics"]["perf/first_step_s"]["mean"] == pytest.approx(1.6)
    assert _cond(rep, "papo")["metrics"]["perf/first_step_s"]["mean"] == pytest.approx(8.2)
    assert _cond(rep, "grpo")["runs"][0]["parent_s"] == pytest.approx(73.5)
    text = md.read_text()
    assert "| time to first step (s) |" in text and "first step at (s)" not in text
    assert "the start of the run's own stages" in text and "is not counted" in text
    assert "1 start, first step at 1.6 s" in text and "(73.5 s, not counted)" in text
    assert "1 start, first step at 8.2 s" in text
    # the run's console summary counts the same way, and says the total with the parent
    line = _summary_lines(caplog, _completion(abstaining()))
    assert "first step done at 1.6 s after the run's own start (75.1 s counting its parent)" in line
