"""Dataset rows -> the Hugging Face datasets TRL trainers consume.

RL arms: a conversational `prompt` (the user turn; TRL inserts the image part), an `image`
column (decoded lazily from the dataset root) for VLMs, `row`: the JSON the reward function
scores against (key, relation, answer_type, target, choices), and `views`: the JSON of the
row's linkage that evi_po's terms read (candidates C_q in target space, the target's index in
them, and on FULL rows the absolute paths of the group's MISSING and CONTROL images); grpo and
papo ignore it. SFT: `prompt` + `completion` (the target in the answer schema) + `image`, in one
seeded epoch order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.rewards.answers import format_answer, normalize_target, prompt_text
from harness.data import row_key


def reward_record(row: dict) -> str:
    """The `row` column: what the reward functions read of a row (harness.rewards.functions.Rewards.columns)."""
    return json.dumps({"key": row_key(row), "relation": row["relation"], "answer_type": row["answer_type"],
                       "target": row["target"], "choices": row.get("choices"), "question": row["question"],
                       "meta": row.get("meta")}, sort_keys=True)


def user_turn(row: dict) -> list[dict]:
    return [{"role": "user", "content": prompt_text(row)}]


def image_path(root: Path, row: dict) -> str:
    return str(root / row["images"][0]["path"])


def _with_images(columns: dict, root: Path, rows: list[dict], is_vlm: bool):
    from datasets import Dataset, Image

    if is_vlm:
        columns["image"] = [image_path(root, r) for r in rows]
        return Dataset.from_dict(columns).cast_column("image", Image())
    return Dataset.from_dict(columns)


def group_candidates(rows: list[dict]) -> dict[str, list[str]]:
    """group_id -> the group's answers in target space ("" = abstention), for rows without `candidates`:
    every view's target plus the abstention, in first-seen order."""
    out: dict[str, list[str]] = {}
    for r in rows:
        cands = out.setdefault(r["group_id"], [])
        for t in (normalize_target(r["target"], r["answer_type"], r.get("choices")), ""):
            if t not in cands:
                cands.append(t)
    return out


def view_links(root: Path, row: dict, fallback: dict[str, list[str]]) -> str:
    """The `views` column of one row (JSON): candidates, target_index, missing_image, control_image."""
    atype, choices = row["answer_type"], row.get("choices")
    cands = [normalize_target(c, atype, choices) for c in (row.get("candidates") or fallback[row["group_id"]])]
    target = normalize_target(row["target"], atype, choices)
    if target not in cands:  # validate refuses this for explicit candidates; keep the term well defined anyway
        cands.append(target)

    def first(key: str) -> str | None:
        refs = row.get(key) or []
        return str(root / refs[0]["path"]) if refs and row["relation"] == "FULL" else None

    return json.dumps({"candidates": cands, "target_index": cands.index(target),
                       "missing_image": first("missing_images"), "control_image": first("control_images")},
                      sort_keys=True)


def rl_dataset(root: Path, rows: list[dict], *, is_vlm: bool):
    fallback = group_candidates(rows)
    return _with_images({"prompt": [user_turn(r) for r in rows], "row": [reward_record(r) for r in rows],
                         "views": [view_links(root, r, fallback) for r in rows]}, root, rows, is_vlm)


def sft_order(rows: list[dict], seed: int, passes: int = 1) -> list[dict]:
    """The deterministic sequence of `passes` epochs the loss-token cap takes its prefix from: the first in the
    order `random.Random(seed)` shuffles the rows into (what a one-pass run always trained on), each later one in
    a fresh order of its own seed."""
    base = sorted(rows, key=row_key)
    out = []
    for p in range(passes):
        epoch = list(base)
        random.Random(seed if p == 0 else f"sft-pass:{seed}:{p}").shuffle(epoch)
        out += epoch
    return out


def sft_passes(arm, max_steps: int, rows: int) -> int:
    """Passes over `rows` training rows an SFT run plans: as many as budget.max_steps can use, at most arm.epochs.
    `arm`: the typed SftArm (Plan.cfg.arm), or its dict."""
    get = arm.get if isinstance(arm, dict) else lambda key, default=None: getattr(arm, key, default)
    needed = max(1, -(-max_steps * get("batch_size") // max(rows, 1)))
    epochs = get("epochs", 1)  # a plan from before arm.epochs trained one pass
    return needed if epochs is None else min(needed, epochs)


def sft_dataset(root: Path, rows: list[dict], *, is_vlm: bool, seed: int, passes: int = 1):
    rows = sft_order(rows, seed, passes)
    return _with_images({
        "prompt": [user_turn(r) for r in rows],
        "completion": [[{"role": "assistant", "content": format_answer(r["target"])}] for r in rows],
    }, root, rows, is_vlm)


def corpus(rows: list[dict]) -> list[str]:
    """Every text the model will read or write: what the tiny tokenizer is trained on."""
    out = []
    for r in rows:
        out.append(prompt_text(r))
        out.append(format_answer(r["target"]))
    return out
