"""Greedy evaluation on a held-out split: accuracy overall and per relation, abstention, format validity.

Every view is scored by the run's reward functions (harness.rewards.functions.Rewards: the built-in relation-aware
reward, or reward._target_), the code the RL arms train on, so "correct" and "reward" mean the same thing in
training and eval. The subset (data.eval_max_items) is the
first N views in row-key order: whole groups, the same items for every arm and seed.
Direction accuracy (evi_po's ranking metric, computed for every arm so arms compare): does the policy
score the view's target highest among its group's candidates, teacher-forced (direction_correct).
Writes eval/<split>[-<label>].json (metrics + the run's identity) and a predictions JSONL next
to it; never touches the run's manifest.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from harness.rewards.answers import prompt_text
from harness.data import RELATIONS, row_key
from harness.eval import artifact_path, decoding
from harness.rewards import cut_at_eos
from harness.rundir import atomic_write_bytes, atomic_write_json, now
from harness.data.trainsets import user_turn


def eval_rows(rows: list[dict], max_items: int | None) -> list[dict]:
    rows = sorted(rows, key=row_key)
    return rows[:max_items] if max_items else rows


def prompt_messages(row: dict, is_vlm: bool) -> list[dict]:
    """The user turn a prompt is rendered from: the image part first (as TRL inserts it), then the text."""
    text = prompt_text(row)
    content = [{"type": "image"}, {"type": "text", "text": text}] if is_vlm else text
    return [{"role": "user", "content": content}]


#: What generate() would otherwise take from the checkpoint's generation_config.json: transformers fills every
#: generation argument not passed from the model's own config (an instruct checkpoint ships repetition_penalty
#: 1.05, which would reach "greedy"), so each logits-changing one is passed at its neutral value. The sampling
#: ones (temperature, top_k, top_p, ...) do nothing under do_sample=False.
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_length": 0,
            "min_new_tokens": None, "bad_words_ids": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
            "forced_eos_token_id": None, "sequence_bias": None, "num_beams": 1, "num_return_sequences": 1,
            "renormalize_logits": False, "exponential_decay_length_penalty": None}


def neutral_generation_kwargs(model) -> dict:
    """The decoding arguments the model's generation config sets away from neutral, set back: greedy decoding is
    the argmax at every step, whatever checkpoint it is."""
    own = getattr(model, "generation_config", None)
    if own is None:
        return {}
    return {k: v for k, v in _NEUTRAL.items() if getattr(own, k, None) not in (None, v)}


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
    neutral = neutral_generation_kwargs(model)
    try:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            texts = [processor.apply_chat_template(prompt_messages(r, is_vlm), add_generation_prompt=True, tokenize=False)
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
                                     eos_token_id=list(eos), **neutral)
            for row, seq in zip(batch, out[:, inputs["input_ids"].shape[1]:].tolist()):
                ids, truncated = cut_at_eos(seq, eos)
                yield row, tok.decode(ids, skip_special_tokens=True), ids, truncated
    finally:
        model.train(was_training)


def direction_correct(model, processor, root: Path, rows: list[dict], *, is_vlm: bool,
                      batch_size: int) -> list[bool | None]:
    """Per row: does the policy rank the view's target first among its group's candidates? (None: < 2)"""
    return [None if s is None else max(range(len(s)), key=s.__getitem__) == t
            for s, t in direction_scores(model, processor, root, rows, is_vlm=is_vlm, batch_size=batch_size)]


def direction_scores(model, processor, root: Path, rows: list[dict], *, is_vlm: bool,
                     batch_size: int) -> list[tuple[list[float] | None, int]]:
    """Per row: (s(c | v) for each of its group's candidates, the target's index).

    The candidate score is evi_po's s(c | v) (docs/arms.md): the mean log-probability of the candidate's own
    tokens after the chat prompt and the answer prefix, teacher-forced, no generation. Candidates and the
    target's index come from the same linkage evi_po trains on (harness.data.trainsets.view_links), so the number
    means the same for every arm. Scores are None for a row with fewer than two candidates.
    """
    import json

    import torch
    import torch.nn.functional as F
    from PIL import Image

    from harness.rewards.answers import candidate_tokens, format_answer
    from harness.data.trainsets import group_candidates, view_links

    tok = getattr(processor, "tokenizer", processor)
    fallback = group_candidates(rows)
    links = [json.loads(view_links(root, r, fallback)) for r in rows]
    splits: dict[tuple, tuple] = {}
    for lk in links:
        key = tuple(lk["candidates"])
        if len(key) >= 2 and key not in splits:
            splits[key] = candidate_tokens([tok(format_answer(c), add_special_tokens=False)["input_ids"] for c in key])
    out: list = [(None, lk["target_index"]) for lk in links]
    todo = [i for i, lk in enumerate(links) if len(lk["candidates"]) >= 2]
    was_training, side = model.training, tok.padding_side
    model.eval()
    tok.padding_side = "left"  # prompts end where the candidates start
    device = next(model.parameters()).device
    per_batch = max(1, batch_size // max((len(s[1]) for s in splits.values()), default=1))
    try:
        for start in range(0, len(todo), per_batch):
            idx = todo[start:start + per_batch]
            reps = []  # (row index, candidate index) per sequence
            for i in idx:
                reps += [(i, c) for c in range(len(links[i]["candidates"]))]
            texts = [processor.apply_chat_template(prompt_messages(rows[i], is_vlm), add_generation_prompt=True,
                                                   tokenize=False) for i, _ in reps]
            if is_vlm:
                opened = {i: Image.open(root / rows[i]["images"][0]["path"]).convert("RGB") for i in idx}
                enc = processor(text=texts, images=[[opened[i]] for i, _ in reps], padding=True, return_tensors="pt")
            else:
                enc = tok(texts, padding=True, return_tensors="pt", add_special_tokens=False)
            ids, real, mask = _candidate_batch([splits[tuple(links[i]["candidates"])] for i, _ in reps],
                                               [c for _, c in reps], tok.pad_token_id)
            L = ids.size(1)
            enc = {k: v for k, v in enc.items() if hasattr(v, "to")}
            enc["input_ids"] = torch.cat([enc["input_ids"], ids], dim=1)  # (N, P + L)
            enc["attention_mask"] = torch.cat([enc["attention_mask"], real], dim=1)
            for key in ("mm_token_type_ids", "token_type_ids"):
                if key in enc:
                    enc[key] = torch.cat([enc[key], enc[key].new_zeros(len(reps), L)], dim=1)
            enc = {k: v.to(device) for k, v in enc.items()}
            with torch.no_grad():
                logits = model(**enc, logits_to_keep=L + 1).logits[:, :L].float()  # predicts tokens P .. P+L-1
            logp = F.log_softmax(logits, dim=-1).gather(-1, ids.to(device).unsqueeze(-1)).squeeze(-1).cpu()
            scores = (logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (N,) length-normalized
            k = 0
            for i in idx:
                C = len(links[i]["candidates"])
                out[i] = (scores[k:k + C].tolist(), links[i]["target_index"])
                k += C
    finally:
        model.train(was_training)
        tok.padding_side = side
    return out


def _candidate_batch(splits: list[tuple], candidates: list[int], pad_id: int):
    """(ids, real, scored) (N, L): each sequence's answer prefix + candidate tokens, right-padded; its real
    tokens; the candidate's own tokens (the ones s(c | v) averages over)."""
    import torch

    seqs = [prefix + conts[c] for (prefix, conts, _), c in zip(splits, candidates)]
    L = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    real = torch.zeros(len(seqs), L, dtype=torch.long)
    mask = torch.zeros(len(seqs), L)
    for k, ((prefix, _, scored), c, x) in enumerate(zip(splits, candidates, seqs)):
        ids[k, :len(x)] = torch.tensor(x)
        real[k, :len(x)] = 1
        mask[k, len(prefix):len(prefix) + scored[c]] = 1.0
    return ids, real, mask


def summarize(scored: list[tuple[dict, object]], direction: list[bool | None] | None = None) -> dict:
    """Metrics from (row, ScoreTrace) pairs, and per-row direction correctness when computed."""
    direction = direction or [None] * len(scored)
    hit = {id(row): d for (row, _), d in zip(scored, direction)}

    def block(items):
        n = len(items)
        if not n:
            return {"n": 0}
        out = {
            "n": n,
            "accuracy": sum(t.correct for _, t in items) / n,
            "abstention_rate": sum(t.abstained for _, t in items) / n,
            "format_valid": sum(t.parser_error is None for _, t in items) / n,
            "truncated": sum(t.truncated for _, t in items) / n,
            "mean_reward": sum(t.total for _, t in items) / n,
        }
        ranked = [hit[id(row)] for row, _ in items if hit[id(row)] is not None]
        if ranked:
            out["direction_accuracy"] = sum(ranked) / len(ranked)
        return out

    by_rel = defaultdict(list)
    for row, t in scored:
        by_rel[row["relation"]].append((row, t))
    out = block(scored)
    out["per_relation"] = {rel: block(by_rel[rel]) for rel in RELATIONS if by_rel.get(rel)}
    return out


def run_eval(model, processor, root: Path, rows: list[dict], *, plan, run_dir: Path, split: str, label: str,
             policy: str, rewards, is_vlm: bool, max_new_tokens: int, batch_size: int,
             suppress_token_ids: list[int], eos_token_ids: list[int], extra: dict | None = None) -> dict:
    """Evaluate and write eval/<split>[-label].json with its predictions (`evaluate`, then `write_eval`)."""
    result, preds = evaluate(model, processor, root, rows, plan=plan, split=split, label=label, policy=policy,
                             rewards=rewards, is_vlm=is_vlm, max_new_tokens=max_new_tokens,
                             batch_size=batch_size, suppress_token_ids=suppress_token_ids,
                             eos_token_ids=eos_token_ids, extra=extra)
    write_eval(run_dir, result, preds)
    return result


def evaluate(model, processor, root: Path, rows: list[dict], *, plan, split: str, label: str, policy: str,
             rewards, is_vlm: bool, max_new_tokens: int, batch_size: int, suppress_token_ids: list[int],
             eos_token_ids: list[int], extra: dict | None = None) -> tuple[dict, list[dict]]:
    """(the artifact's content, one prediction per view): greedy completions scored, direction accuracy; writes
    nothing (a periodic eval writes once its checkpoint's weights digest is known)."""
    t0 = time.time()
    generated = list(generate_greedy(
        model, processor, root, rows, is_vlm=is_vlm, max_new_tokens=max_new_tokens, batch_size=batch_size,
        suppress_token_ids=suppress_token_ids, eos_token_ids=eos_token_ids,
    ))
    # the run's reward functions score the greedy answers as they score sampled ones (reward._target_)
    records = [{**row, "key": row_key(row)} for row, *_ in generated]
    traces = rewards.score([user_turn(row) for row, *_ in generated],
                           [[{"role": "assistant", "content": text}] for _, text, _, _ in generated],
                           [ids for *_, ids, _ in generated], records, [t for *_, t in generated])
    scored, preds = [], []
    for (row, text, ids, truncated), tr in zip(generated, traces):
        scored.append((row, tr))
        preds.append({"view": row_key(row), "relation": row["relation"], "completion": text, "tokens": len(ids),
                      "prediction": tr.prediction, "gold": tr.gold, "correct": tr.correct,
                      "parser_error": tr.parser_error, "reward": tr.total})
    direction = direction_correct(model, processor, root, rows, is_vlm=is_vlm, batch_size=batch_size)
    for p, d in zip(preds, direction):
        p["direction_correct"] = d
    result = {
        "split": split,
        "label": label,
        "policy": policy,
        "decoding": decoding(max_new_tokens, batch_size),
        "created_at": now(),
        "wall_s": round(time.time() - t0, 3),
        "run_name": plan.run_name,
        "identity": {k: plan.identity.get(k) for k in ("config_sha256", "semantic_sha256", "data", "model", "code")},
        **(extra or {}),
        **summarize(scored, direction),
    }
    return result, preds


def write_eval(run_dir: Path, result: dict, preds: list[dict]) -> Path:
    """eval/<split>[-label].json and its predictions JSONL (written first: the artifact names a complete eval)."""
    import json

    out = artifact_path(run_dir, result["split"], result["label"])
    atomic_write_bytes(out.with_suffix(".predictions.jsonl"),
                       "".join(json.dumps(p, sort_keys=True) + "\n" for p in preds).encode())
    atomic_write_json(out, result)
    return out
