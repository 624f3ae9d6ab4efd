"""Greedy evaluation on a held-out split: accuracy overall and per relation, abstention, format validity.

Every view is scored with the same reward code the RL arms train on (harness.rewards.score), so
"correct" means the same thing in training and eval. The subset (data.eval_max_items) is the
first N views in row-key order: whole groups, the same items for every arm and seed.
Writes eval/<split>[-<label>].json (metrics + the run's identity) and a predictions JSONL next
to it; never touches the run's manifest.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from harness.answers import prompt_text
from harness.data import RELATIONS, row_key
from harness.rewards import score
from harness.rundir import atomic_write_bytes, atomic_write_json, now


def eval_rows(rows: list[dict], max_items: int | None) -> list[dict]:
    rows = sorted(rows, key=row_key)
    return rows[:max_items] if max_items else rows


def _messages(row: dict, is_vlm: bool) -> list[dict]:
    text = prompt_text(row)
    content = [{"type": "image"}, {"type": "text", "text": text}] if is_vlm else text
    return [{"role": "user", "content": content}]


def generate_greedy(model, processor, root: Path, rows: list[dict], *, is_vlm: bool, max_new_tokens: int,
                    batch_size: int, suppress_token_ids: list[int], eos_token_ids: list[int]):
    """Yield (row, completion text, completion ids, truncated) for every row, in order."""
    import torch
    from PIL import Image

    tok = getattr(processor, "tokenizer", processor)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    eos = set(eos_token_ids)
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            texts = [processor.apply_chat_template(_messages(r, is_vlm), add_generation_prompt=True, tokenize=False)
                     for r in batch]
            if is_vlm:
                images = [[Image.open(root / r["images"][0]["path"]).convert("RGB")] for r in batch]
                inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
            else:
                inputs = tok(texts, padding=True, return_tensors="pt", add_special_tokens=False)
            inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in inputs.items()}
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                     suppress_tokens=suppress_token_ids or None, pad_token_id=tok.pad_token_id,
                                     eos_token_id=list(eos))
            for row, seq in zip(batch, out[:, inputs["input_ids"].shape[1]:].tolist()):
                ids = []
                for t in seq:  # up to and including the first end-of-sequence token
                    ids.append(t)
                    if t in eos:
                        break
                truncated = not ids or ids[-1] not in eos
                yield row, tok.decode(ids, skip_special_tokens=True), ids, truncated
    finally:
        model.train(was_training)


def summarize(scored: list[tuple[dict, object]]) -> dict:
    """Metrics from (row, ScoreTrace) pairs."""
    def block(items):
        n = len(items)
        if not n:
            return {"n": 0}
        return {
            "n": n,
            "accuracy": sum(t.correct for _, t in items) / n,
            "abstention_rate": sum(t.abstained for _, t in items) / n,
            "format_valid": sum(t.parser_error is None for _, t in items) / n,
            "truncated": sum(t.truncated for _, t in items) / n,
        }

    by_rel = defaultdict(list)
    for row, t in scored:
        by_rel[row["relation"]].append((row, t))
    out = block(scored)
    out["per_relation"] = {rel: block(by_rel[rel]) for rel in RELATIONS if by_rel.get(rel)}
    return out


def run_eval(model, processor, root: Path, rows: list[dict], *, plan, run_dir: Path, split: str, label: str,
             policy: str, reward_cfg, is_vlm: bool, max_new_tokens: int, batch_size: int,
             suppress_token_ids: list[int], eos_token_ids: list[int]) -> dict:
    t0 = time.time()
    scored, preds = [], []
    import json

    for row, text, ids, truncated in generate_greedy(
        model, processor, root, rows, is_vlm=is_vlm, max_new_tokens=max_new_tokens, batch_size=batch_size,
        suppress_token_ids=suppress_token_ids, eos_token_ids=eos_token_ids,
    ):
        tr = score(text, row, truncated=truncated, cfg=reward_cfg)
        scored.append((row, tr))
        preds.append({"view": row_key(row), "relation": row["relation"], "completion": text, "tokens": len(ids),
                      "prediction": tr.prediction, "gold": tr.gold, "correct": tr.correct,
                      "parser_error": tr.parser_error})
    result = {
        "split": split,
        "label": label,
        "policy": policy,
        "decoding": {"greedy": True, "max_new_tokens": max_new_tokens},
        "created_at": now(),
        "wall_s": round(time.time() - t0, 3),
        "run_name": plan.run_name,
        "identity": {k: plan.identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model", "code")},
        **summarize(scored),
    }
    name = split if label == "final" else f"{split}-{label}"
    atomic_write_bytes(run_dir / "eval" / f"{name}.predictions.jsonl",
                       "".join(json.dumps(p, sort_keys=True) + "\n" for p in preds).encode())
    atomic_write_json(run_dir / "eval" / f"{name}.json", result)
    return result
