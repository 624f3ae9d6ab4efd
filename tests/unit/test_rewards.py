"""The reward: relation-aware correctness, format term, invalid penalty, trace rows."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from harness.rewards import completion_text, score


@dataclass
class Cfg:  # the fields of harness.config.schema.RewardConfig
    correct: float = 1.0
    format_weight: float = 0.1
    invalid_penalty: float = 0.5


def row(relation="FULL", target="red", answer_type="word", choices=None):
    r = {"relation": relation, "target": target, "answer_type": answer_type}
    if choices is not None:
        r["choices"] = choices
    return r


CHOICES = [{"key": "A", "text": "cat"}, {"key": "B", "text": "dog"}]

CASES = [
    # id, completion, record, truncated, total, correct, parser_error
    ("full-right", "<answer>red</answer>", row(), False, 1.1, True, None),
    ("full-mixed-case", "<answer>The RED.</answer>", row(), False, 1.1, True, None),
    ("full-wrong", "<answer>blue</answer>", row(), False, 0.1, False, None),
    ("full-abstains", "<answer>unknown</answer>", row(), False, 0.1, False, None),
    ("control-right", "<answer>red</answer>", row("CONTROL"), False, 1.1, True, None),
    ("substitute-right", "<answer>blue</answer>", row("SUBSTITUTE", "blue"), False, 1.1, True, None),
    ("substitute-says-original", "<answer>red</answer>", row("SUBSTITUTE", "blue"), False, 0.1, False, None),
    ("missing-abstains", "<answer>unknown</answer>", row("MISSING", ""), False, 1.1, True, None),
    ("missing-abstains-case", "<answer>Unknown.</answer>", row("MISSING", ""), False, 1.1, True, None),
    ("missing-answers", "<answer>red</answer>", row("MISSING", ""), False, 0.1, False, None),
    ("missing-unknowns", "<answer>unknowns</answer>", row("MISSING", ""), False, 0.1, False, None),
    ("not-is-not-no", "<answer>not</answer>", row(target="no"), False, 0.1, False, None),
    ("no-is-no", "<answer>No</answer>", row(target="no"), False, 1.1, True, None),
    ("choice-paren", "<answer>(b)</answer>", row(target="B", answer_type="choice", choices=CHOICES), False, 1.1, True, None),
    ("choice-text", "<answer>dog</answer>", row(target="B", answer_type="choice", choices=CHOICES), False, 1.1, True, None),
    ("choice-unrecognized", "<answer>horse</answer>", row(target="B", answer_type="choice", choices=CHOICES), False, 0.1, False, None),
    ("number-word", "<answer>three</answer>", row(target="3", answer_type="number"), False, 1.1, True, None),
    ("number-float", "<answer>3.0</answer>", row(target="3", answer_type="number"), False, 1.1, True, None),
    ("number-wrong", "<answer>4</answer>", row(target="3", answer_type="number"), False, 0.1, False, None),
    ("number-missing", "<answer>unknown</answer>", row("MISSING", "", answer_type="number"), False, 1.1, True, None),
    ("truncated-valid-text", "<answer>red</answer>", row(), True, -0.5, False, "truncated"),
    ("truncated-cut", "<answer>re", row(), True, -0.5, False, "unbalanced_tags"),
    ("missing-truncated-abstain", "<answer>unknown</answer>", row("MISSING", ""), True, -0.5, False, "truncated"),
    ("no-tags", "red", row(), False, -0.5, False, "no_answer_tag"),
    ("empty", "", row(), False, -0.5, False, "empty_completion"),
    ("whitespace", "  \n", row(), False, -0.5, False, "empty_completion"),
    ("empty-answer", "<answer></answer>", row("MISSING", ""), False, -0.5, False, "empty_answer"),
    ("nested", "<answer>a <answer>red</answer></answer>", row(), False, -0.5, False, "nested_answer_tag"),
    ("trailing-text", "<answer>red</answer> it is red", row(), False, -0.5, False, "text_after_answer"),
    ("eos-after", "<answer>red</answer><|im_end|>", row(), False, 1.1, True, None),
]


@pytest.mark.parametrize("completion, record, truncated, total, correct, error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_score(completion, record, truncated, total, correct, error):
    t = score(completion, record, truncated=truncated, cfg=Cfg())
    assert t.total == pytest.approx(total)
    assert t.correct is correct
    assert t.parser_error == error
    assert t.total == pytest.approx(sum(t.components.values()))
    assert t.relation == record["relation"] and t.truncated is truncated


def test_components_follow_the_config():
    cfg = Cfg(correct=2.0, format_weight=0.0, invalid_penalty=1.0)
    good = score("<answer>red</answer>", row(), truncated=False, cfg=cfg)
    bad = score("oops", row(), truncated=False, cfg=cfg)
    assert good.components == {"correct": 2.0, "format": 0.0, "invalid": 0.0}
    assert bad.components == {"correct": 0.0, "format": 0.0, "invalid": -1.0}


def test_trace_fields_and_json():
    t = score("<answer>The Red</answer>", row(), truncated=False, cfg=Cfg())
    assert (t.parsed, t.prediction, t.gold, t.abstained) == ("The Red", "red", "red", False)
    d = json.loads(t.to_json())
    assert set(d) >= {"parsed", "prediction", "gold", "components", "total", "parser_error", "relation", "truncated"}
    assert d == t.to_dict()
    m = score("<answer>unknown</answer>", row("MISSING", ""), truncated=False, cfg=Cfg())
    assert (m.prediction, m.gold, m.abstained) == ("", "", True)


def test_reward_is_torch_free_and_pure():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import harness.rewards"], capture_output=True, text=True, check=True)
    mods = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines() if "|" in line}
    assert not mods & {"torch", "transformers", "trl", "numpy"}


@pytest.mark.parametrize(
    "completion, text",
    [
        ("<answer>red</answer>", "<answer>red</answer>"),
        ([{"role": "assistant", "content": "<answer>red</answer>"}], "<answer>red</answer>"),
        ([{"role": "assistant", "content": [{"type": "text", "text": "<answer>"}, {"type": "text", "text": "red</answer>"}]}], "<answer>red</answer>"),
    ],
)
def test_completion_text(completion, text):
    assert completion_text(completion) == text


def test_cut_at_eos_is_the_rule_the_ledger_eval_and_evi_po_each_used_to_spell_out():
    """One truncation rule replaced three spellings; it must agree with each on every shape of sequence."""
    import random

    from harness.rewards import cut_at_eos

    eos, pad = {7, 9}, 0
    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.choice([0, 1, 2, 7, 9]) for _ in range(rng.randint(0, 6))]
        got_ids, got_trunc = cut_at_eos(ids, eos, pad)
        # greedy eval: up to and including the first eos, truncated when the last kept token is no eos
        kept = []
        for t in ids:
            kept.append(t)
            if t in eos:
                break
        assert cut_at_eos(ids, eos) == (kept, not kept or kept[-1] not in eos)
        # evi_po's grading: padding dropped from a truncated row
        end = next((j for j, t in enumerate(ids) if t in eos), None)
        assert (got_ids, got_trunc) == (([t for t in ids if t != pad], True) if end is None
                                        else (ids[: end + 1], False))
        # the ledger (TRL's ids end at their first eos): truncated = empty or no eos at the end
        if end is None or end == len(ids) - 1:
            assert got_trunc == (not ids or ids[-1] not in eos)
