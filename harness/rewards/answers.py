"""The answer schema: one format, one parser, normalizers per answer type, one abstention value.

Format. The prompt asks for exactly one `<answer>...</answer>` pair (the tags are ordinary text,
not special tokens: TRL strips special tokens when it decodes completions, docs/platform.md). The
same format is the regex `ANSWER_REGEX`, which vLLM can constrain sampling to (structured
output); it uses only literals, character classes, one optional group and bounded repetition,
no lookarounds or backreferences, so every regex-to-automaton backend accepts it.

Parser policy (`parse_answer`), strict on purpose so that "well-formed" means the same thing
for the parser, the format reward and constrained decoding:

- Leading and trailing whitespace, and trailing end-of-sequence markers (`EOS_MARKERS`, in
  case a caller decoded without skipping special tokens), are ignored.
- Anything else before `<answer>` or after `</answer>` makes the completion malformed
  (`text_before_answer`, `text_after_answer`): a completion that keeps talking after its
  answer wastes the token budget, and constrained decoding could not have produced it.
- Exactly one pair of lower-case tags; a second pair is `multiple_answers`, an `<answer>`
  inside the answer is `nested_answer_tag`, unpaired tags are `unbalanced_tags`.
- The answer itself: 1..MAX_ANSWER_CHARS characters, no `<`, `>` or line breaks, no
  whitespace right inside the tags (`padded_answer`): `<answer>red</answer>` is the one
  spelling the SFT targets teach.
A completion is well-formed exactly when, after the stripping above, it fully matches
ANSWER_REGEX (tests check the two agree on a corpus of adversarial strings).

Normalizers map an answer to the *target space* of the dataset (docs/data.md):
"" is the abstention, choice answers become the choice key ("(b)", "b.", "Option B" -> "B"),
words (and free-form `text` answers) are casefolded with punctuation and a leading article removed
("The Red." -> "red"),
numbers become a canonical decimal string ("3.0", "+3", "three" -> "3"). Matching is on whole
normalized strings, never prefixes: "not" is not "no", "unknowns" is not an abstention.

Pure and torch-free: imported by the reward function, the dataset validator and eval.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

# --- the format

#: The abstention literal the model writes when the image does not show what is asked.
#: Stored in datasets as the empty target "" (docs/data.md); `target_text` maps back.
ABSTAIN = "unknown"

OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"
MAX_ANSWER_CHARS = 64

#: Full-match regex of a well-formed completion (first and last answer character not blank,
#: no angle brackets or line breaks inside, at most MAX_ANSWER_CHARS characters).
ANSWER_REGEX = r"<answer>[^<> \t\r\n]([^<>\r\n]{0,62}[^<> \t\r\n])?</answer>"
_ANSWER_RE = re.compile(ANSWER_REGEX)

#: Decoded end-of-sequence markers tolerated after the answer (Qwen chat and base models).
EOS_MARKERS = ("<|im_end|>", "<|endoftext|>")

ANSWER_TYPES = ("choice", "word", "number", "text")


@dataclass(frozen=True)
class ParsedAnswer:
    """The text between the tags (None when malformed) and the parser error code (None when fine)."""

    answer: str | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _strip_eos(text: str) -> str:
    text = text.rstrip()
    changed = True
    while changed:  # "...</answer><|im_end|><|endoftext|>" strips both
        changed = False
        for marker in EOS_MARKERS:
            if text.endswith(marker):
                text, changed = text[: -len(marker)].rstrip(), True
    return text


def parse_answer(completion: str) -> ParsedAnswer:
    """Parse one completion under the strict policy of the module docstring."""
    text = _strip_eos(completion).lstrip()
    if not text:
        return ParsedAnswer(None, "empty_completion")
    n_open, n_close = text.count(OPEN_TAG), text.count(CLOSE_TAG)
    if n_open == 0 and n_close == 0:
        return ParsedAnswer(None, "no_answer_tag")
    if n_open != n_close:
        return ParsedAnswer(None, "unbalanced_tags")
    start = text.find(OPEN_TAG)
    end = text.find(CLOSE_TAG)
    if end < start:
        return ParsedAnswer(None, "unbalanced_tags")
    inner = text[start + len(OPEN_TAG) : end]
    if OPEN_TAG in inner:
        return ParsedAnswer(None, "nested_answer_tag")
    if n_open > 1:
        return ParsedAnswer(None, "multiple_answers")
    if text[:start].strip():
        return ParsedAnswer(None, "text_before_answer")
    if text[end + len(CLOSE_TAG) :].strip():
        return ParsedAnswer(None, "text_after_answer")
    if not inner.strip():
        return ParsedAnswer(None, "empty_answer")
    if "\n" in inner or "\r" in inner:
        return ParsedAnswer(None, "newline_in_answer")
    if inner != inner.strip(" \t"):
        return ParsedAnswer(None, "padded_answer")
    if "<" in inner or ">" in inner:
        return ParsedAnswer(None, "angle_bracket_in_answer")
    if len(inner) > MAX_ANSWER_CHARS:
        return ParsedAnswer(None, "answer_too_long")
    # Safety net: the checks above must define exactly the regex's language.
    if not _ANSWER_RE.fullmatch(text):
        return ParsedAnswer(None, "not_matching_answer_regex")
    return ParsedAnswer(inner, None)


def format_answer(target: str) -> str:
    """The completion that answers `target` (target space: "" is the abstention)."""
    return f"{OPEN_TAG}{target_text(target)}{CLOSE_TAG}"


def target_text(target: str) -> str:
    """What the model writes for a target: the abstention literal for ""."""
    return target if target != "" else ABSTAIN


# --- normalizers

_ARTICLES = ("a", "an", "the")


@functools.lru_cache(maxsize=1 << 16)  # a pure function of a str, called ~7 times per dataset row and per score
def normalize_word(text: str) -> str:
    """Casefold, NFKC, punctuation and symbols to spaces, collapse spaces, drop one leading article."""
    text = unicodedata.normalize("NFKC", text).casefold()
    # Punctuation (P*) and symbols (S*) separate words; keeping letters, digits and marks only.
    text = "".join(" " if unicodedata.category(ch)[0] in "PSZC" else ch for ch in text)
    words = text.split()
    if len(words) > 1 and words[0] in _ARTICLES:
        words = words[1:]
    return " ".join(words)


def is_abstention(answer: str) -> bool:
    """True only when the whole answer normalizes to ABSTAIN ("Unknown." yes; "unknowns", "not unknown" no)."""
    return normalize_word(answer) == ABSTAIN


_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100}
_NUMBER_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d{1,3})?")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
_MAX_EXPONENT = 30  # "1e999" would canonicalize to a thousand digits: refuse instead


def normalize_number(text: str) -> str | None:
    """Canonical decimal string ("3", "-2.5", "1000") or None when `text` is not one number."""
    t = text.strip()
    word = normalize_word(t)  # "Three." -> "three"
    if word in _NUMBER_WORDS:
        return str(_NUMBER_WORDS[word])
    if _THOUSANDS_RE.fullmatch(t):
        t = t.replace(",", "")
    if not _NUMBER_RE.fullmatch(t):
        return None
    try:
        d = Decimal(t)
    except InvalidOperation:  # pragma: no cover - the regex admits only valid literals
        return None
    if not d.is_finite() or abs(d.adjusted()) > _MAX_EXPONENT:
        return None
    if d == d.to_integral_value():
        return str(int(d))  # "-0" -> "0", "3.0" -> "3", "1e3" -> "1000"
    return format(d.normalize(), "f")


_CHOICE_KEY_RE = re.compile(r"(?:(?:option|choice|answer)\s*)?[(\[]?\s*([A-Za-z0-9]{1,3})\s*[)\]]?\s*[.:)]?", re.I)
_CHOICE_KEY_TEXT_RE = re.compile(r"[(\[]?\s*([A-Za-z0-9]{1,3})\s*[)\]]?\s*[.:)]?\s+(.+)", re.I)


def choice_keys(choices: Sequence[Mapping[str, Any]] | None) -> list[str]:
    return [str(c.get("key", "")) for c in (choices or [])]


def normalize_choice(text: str, choices: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The choice key `text` designates ("(b)", "b.", "Option B", "B. dog", or the choice's text), or None."""
    by_fold = {str(c["key"]).casefold(): str(c["key"]) for c in (choices or [])}
    t = text.strip()
    m = _CHOICE_KEY_RE.fullmatch(t)
    if m and m.group(1).casefold() in by_fold:
        return by_fold[m.group(1).casefold()]
    texts = {str(c["key"]): normalize_word(str(c.get("text", ""))) for c in (choices or [])}
    m = _CHOICE_KEY_TEXT_RE.fullmatch(t)
    if m and m.group(1).casefold() in by_fold:
        key = by_fold[m.group(1).casefold()]
        if normalize_word(m.group(2)) == texts[key]:
            return key  # "B. dog" with B = dog
    hits = [k for k, tx in texts.items() if tx and tx == normalize_word(t)]
    return hits[0] if len(hits) == 1 else None


def normalize_answer(answer: str, answer_type: str, choices: Sequence[Mapping[str, Any]] | None = None) -> str | None:
    """Map a parsed answer into target space: "" for the abstention, the canonical form, or None (unrecognized)."""
    if is_abstention(answer):
        return ""
    if answer_type in ("word", "text"):
        return normalize_word(answer) or None
    if answer_type == "number":
        return normalize_number(answer)
    if answer_type == "choice":
        return normalize_choice(answer, choices)
    raise ValueError(f"answer_type {answer_type!r} is not one of {ANSWER_TYPES}")


def target_problem(target: Any, answer_type: str, choices: Sequence[Mapping[str, Any]] | None = None) -> str | None:
    """Why `target` cannot be written and scored under the answer schema, or None when it can.

    "" (the abstention) is always representable; the relation decides whether it is allowed.
    """
    if not isinstance(target, str):
        return f"target must be a string, got {type(target).__name__}"
    if target == "":
        return None
    if answer_type not in ANSWER_TYPES:
        return f"answer_type {answer_type!r} is not one of {', '.join(ANSWER_TYPES)}"
    if not parse_answer(format_answer(target)).ok:
        return (
            f"<answer>{target}</answer> is not a well-formed answer (1..{MAX_ANSWER_CHARS} characters, "
            "no '<', '>', line breaks or surrounding spaces)"
        )
    if is_abstention(target):
        return f"target normalizes to the abstention literal {ABSTAIN!r}; store abstention as the empty target \"\""
    if answer_type in ("word", "text") and not normalize_word(target):
        return f"a {answer_type} target must keep at least one letter or digit after normalization"
    if answer_type == "number" and normalize_number(target) is None:
        return "a number target must parse as one number (e.g. 3, -2.5, 1,000, three)"
    if answer_type == "choice":
        keys = choice_keys(choices)
        if not keys:
            return "a choice target needs a non-empty choices list"
        if target not in keys:
            return f"a choice target must be one of the choice keys {keys}"
    return None


def normalize_target(target: str, answer_type: str, choices: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The gold answer in target space ("" stays the abstention)."""
    if target == "":
        return ""
    if answer_type == "choice":
        return target  # validated to be a key
    norm = normalize_answer(target, answer_type, choices)
    return norm if norm is not None else target


# --- the prompt

_INSTRUCTION = {
    "word": "Answer with one word",
    "number": "Answer with a number",
    "choice": "Answer with the option key",
    "text": "Answer",
}


def prompt_text(record: Mapping[str, Any]) -> str:
    """The user prompt: question, options if any, and the instruction to answer in tags or abstain."""
    lines = [str(record["question"]).strip()]
    for c in record.get("choices") or []:
        lines.append(f"({c['key']}) {c['text']}")
    unanswerable = "If the image does not show it" if record.get("images") else "If it cannot be answered"
    lines.append(
        f"{_INSTRUCTION[record['answer_type']]} as {OPEN_TAG}...{CLOSE_TAG}. "
        f"{unanswerable}, answer {OPEN_TAG}{ABSTAIN}{CLOSE_TAG}."
    )
    return "\n".join(lines)


def candidate_tokens(token_lists: list[list[int]]) -> tuple[list[int], list[list[int]], list[int]]:
    """Split the tokenized rendered candidates into (shared prefix, continuations, scored lengths).

    continuation_c = candidate c's tokens after the shared prefix; its first `scored_c` tokens are its
    own (the shared suffix, e.g. a closing tag, is not scored; every candidate keeps at least one).
    """
    n = min(len(t) for t in token_lists)
    pre = 0
    while pre < n - 1 and all(t[pre] == token_lists[0][pre] for t in token_lists):
        pre += 1
    suf = 0
    while suf < n - pre - 1 and all(t[-1 - suf] == token_lists[0][-1 - suf] for t in token_lists):
        suf += 1
    conts = [t[pre:] for t in token_lists]
    return token_lists[0][:pre], conts, [len(c) - suf for c in conts]
