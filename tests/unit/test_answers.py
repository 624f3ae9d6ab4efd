"""The answer schema: parser policy, regex agreement, normalizers, abstention, prompt."""

from __future__ import annotations

import re

import pytest

from harness.rewards.answers import (
    ABSTAIN,
    ANSWER_REGEX,
    MAX_ANSWER_CHARS,
    format_answer,
    is_abstention,
    normalize_answer,
    normalize_choice,
    normalize_number,
    normalize_target,
    normalize_word,
    parse_answer,
    prompt_text,
    target_problem,
)

# --- parser

PARSE_CASES = [
    # (completion, answer, error)
    ("<answer>red</answer>", "red", None),
    ("  <answer>red</answer>\n", "red", None),
    ("<answer>red</answer><|im_end|>", "red", None),
    ("<answer>red</answer>\n<|im_end|><|endoftext|>", "red", None),
    ("<answer>Dark Blue</answer>", "Dark Blue", None),
    ("<answer>RED</answer>", "RED", None),
    ("<answer>unknown</answer>", "unknown", None),
    ("<answer>" + "x" * MAX_ANSWER_CHARS + "</answer>", "x" * MAX_ANSWER_CHARS, None),
    ("", None, "empty_completion"),
    ("   \n ", None, "empty_completion"),
    ("<|im_end|>", None, "empty_completion"),
    ("red", None, "no_answer_tag"),
    ("<Answer>red</Answer>", None, "no_answer_tag"),  # tags are lower-case
    ("<answer>red", None, "unbalanced_tags"),
    ("red</answer>", None, "unbalanced_tags"),
    ("</answer>red<answer>", None, "unbalanced_tags"),
    ("<answer>red</answer></answer>", None, "unbalanced_tags"),
    ("<answer>a <answer>b</answer></answer>", None, "nested_answer_tag"),
    ("<answer><answer>red</answer></answer>", None, "nested_answer_tag"),
    ("<answer>a</answer><answer>b</answer>", None, "multiple_answers"),
    ("I think <answer>red</answer>", None, "text_before_answer"),
    ("<answer>red</answer> because it is red", None, "text_after_answer"),
    ("<answer>red</answer><|im_end|>extra", None, "text_after_answer"),
    ("<answer></answer>", None, "empty_answer"),
    ("<answer>   </answer>", None, "empty_answer"),
    ("<answer> red</answer>", None, "padded_answer"),
    ("<answer>red </answer>", None, "padded_answer"),
    ("<answer>red\nblue</answer>", None, "newline_in_answer"),
    ("<answer>a<b</answer>", None, "angle_bracket_in_answer"),
    ("<answer>a>b</answer>", None, "angle_bracket_in_answer"),
    ("<answer>" + "x" * (MAX_ANSWER_CHARS + 1) + "</answer>", None, "answer_too_long"),
]


@pytest.mark.parametrize("completion, answer, error", PARSE_CASES)
def test_parse_answer(completion, answer, error):
    got = parse_answer(completion)
    assert (got.answer, got.error) == (answer, error)


@pytest.mark.parametrize("completion, answer, error", PARSE_CASES)
def test_parser_and_regex_agree(completion, answer, error):
    """Well-formed for the parser <=> full match of ANSWER_REGEX after stripping blanks and EOS."""
    stripped = completion.strip()
    for eos in ("<|endoftext|>", "<|im_end|>"):
        stripped = stripped.removesuffix(eos).strip()
    assert bool(re.fullmatch(ANSWER_REGEX, stripped)) == (error is None)


def test_regex_is_backend_friendly():
    """No lookarounds, backreferences or lazy quantifiers: vLLM's regex backends accept it."""
    for construct in ("(?=", "(?!", "(?<", "\\1", "*?", "+?"):
        assert construct not in ANSWER_REGEX


@pytest.mark.parametrize("target", ["red", "B", "3", "dark blue", ""])
def test_format_answer_round_trips(target):
    parsed = parse_answer(format_answer(target))
    assert parsed.ok
    assert parsed.answer == (target or ABSTAIN)


# --- normalizers


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Red", "red"),
        ("  RED. ", "red"),
        ("The red", "red"),
        ("a blue", "blue"),
        ("the", "the"),  # an article alone stays
        ("dark-blue", "dark blue"),
        ("Ｒｅｄ", "red"),  # NFKC full-width
        ("not", "not"),
        ("no", "no"),
    ],
)
def test_normalize_word(text, expected):
    assert normalize_word(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", "3"), ("3.0", "3"), ("+3", "3"), ("03", "3"), ("three", "3"), ("Three.", "3"),
        ("-2.50", "-2.5"), (".5", "0.5"), ("-0", "0"), ("1,000", "1000"), ("1e3", "1000"),
        ("twenty", "20"), ("3.", "3"),
        ("1e99", None), ("3/4", None), ("x", None), ("", None), ("1,00", None), ("3 apples", None), ("nan", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


CHOICES = [{"key": "A", "text": "cat"}, {"key": "B", "text": "dog"}, {"key": "C", "text": "a red bird"}]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("B", "B"), ("b", "B"), ("(b)", "B"), ("b.", "B"), ("B)", "B"), ("[B]", "B"), ("Option B", "B"),
        ("option b.", "B"), ("B. dog", "B"), ("(B) Dog", "B"), ("dog", "B"), ("Red bird", "C"),
        ("D", None), ("B. cat", None), ("horse", None), ("", None), ("AB", None),
    ],
)
def test_normalize_choice(text, expected):
    assert normalize_choice(text, CHOICES) == expected


@pytest.mark.parametrize(
    "text, abstains",
    [
        ("unknown", True), ("Unknown", True), ("UNKNOWN.", True), (" unknown ", True),
        ("unknowns", False), ("not unknown", False), ("unknown color", False), ("unkn", False), ("no", False), ("", False),
    ],
)
def test_abstention_is_the_whole_literal(text, abstains):
    assert is_abstention(text) is abstains


@pytest.mark.parametrize(
    "answer, answer_type, expected",
    [
        ("Red", "word", "red"), ("unknown", "word", ""), ("Unknown", "number", ""), ("unknown", "choice", ""),
        ("three", "number", "3"), ("(a)", "choice", "A"), ("not", "word", "not"), ("zebra", "choice", None),
    ],
)
def test_normalize_answer(answer, answer_type, expected):
    assert normalize_answer(answer, answer_type, CHOICES) == expected


def test_normalize_answer_rejects_unknown_type():
    with pytest.raises(ValueError, match="answer_type"):
        normalize_answer("red", "colour")


@pytest.mark.parametrize(
    "target, answer_type, problem",
    [
        ("red", "word", None), ("", "word", None), ("B", "choice", None), ("3.5", "number", None),
        ("E", "choice", "choice keys"), ("b", "choice", "choice keys"), ("abc", "number", "one number"),
        ("unknown", "word", "abstention"), ("<answer>red</answer>", "word", "well-formed"), (" red", "word", "well-formed"),
        ("red\nblue", "word", "well-formed"), ("...", "word", "letter or digit"), (3, "number", "string"),
        ("red", "colour", "answer_type"),
    ],
)
def test_target_problem(target, answer_type, problem):
    got = target_problem(target, answer_type, [{"key": "A", "text": "x"}, {"key": "B", "text": "y"}])
    assert (got is None) if problem is None else (problem in got)


def test_normalize_target():
    assert normalize_target("", "word") == ""
    assert normalize_target("The Red", "word") == "red"
    assert normalize_target("3.0", "number") == "3"
    assert normalize_target("B", "choice", CHOICES) == "B"


# --- prompt


def test_prompt_text_word():
    p = prompt_text({"question": "What color is the circle?", "answer_type": "word", "images": [{"path": "x.png"}]})
    assert p.splitlines()[0] == "What color is the circle?"
    assert "<answer>" in p and f"<answer>{ABSTAIN}</answer>" in p and "one word" in p


def test_prompt_text_choices_and_text_only():
    p = prompt_text({"question": "Which animal barks?", "answer_type": "choice", "choices": CHOICES[:2], "images": []})
    assert "(A) cat" in p and "(B) dog" in p and "option key" in p and "cannot be answered" in p
