"""Before any model step: can the checkpoint's processor be built, and does every prompt fit?

- `check_loadable(plan)`: a pretrained checkpoint's processor (tokenizer, image processor, chat template) is built
  before any run dir is claimed (the warm start's included); a failure is a ConfigError naming model.path, not a
  traceback after the warm start started.
- `prompt_lengths(plan, data, processor, context)` (`run` in the policy stage, with the processor, before the
  weights are loaded): every training and evaluated prompt's token count with its image tokens,
  as the checkpoint's processor makes them (the chat template, the tokenizer, the Qwen-VL resize rule with
  model.min_pixels / max_pixels), memoized per dataset digest and processor under `<output_root>/cache/preflight`.
  Refused (ConfigError naming the knob, exit 2) before the first training step, with the count, the worst item and the fix:
  an RL prompt whose tokens plus arm.max_completion_length exceed the model's context, an eval prompt plus
  train.eval_max_new_tokens likewise, an SFT row (prompt + answer) that reaches arm.max_length (TRL would cut it,
  through its image tokens or its answer). The summary (min / median / max tokens, image tokens per image) is
  printed and recorded in the run manifest (`prompt_lengths`). This is what TRL and verl users meet later as
  "Image features and image tokens do not match".
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from pathlib import Path

from harness.errors import ConfigError, Problem

log = logging.getLogger("harness")
PREFLIGHT_VERSION = 1
_CHECKED: set[tuple] = set()


def check_loadable(plan) -> None:
    """Build a pretrained checkpoint's processor, once per process and setting (a sweep's jobs share it)."""
    m = plan.cfg.model
    if m.source != "pretrained":
        return
    path = plan.checkpoint_dir
    key = (path, m.min_pixels, m.max_pixels)
    if key in _CHECKED:
        return
    from harness.policy import load_processing

    try:
        load_processing(Path(path), m)
        _CHECKED.add(key)
    except Exception as err:  # noqa: BLE001  (any loader failure: say which checkpoint and why, not a traceback)
        field = "model.path" if m.path else "model.hub_id"
        raise ConfigError([Problem(field, m.path or m.hub_id,
                                   f"its processor cannot be built ({type(err).__name__}: {str(err).strip()[:400]})",
                                   "restore the checkpoint's tokenizer and processor files (tokenizer.json, "
                                   "tokenizer_config.json, preprocessor_config.json, chat_template.json), or use "
                                   "another checkpoint")]) from err


# --- prompt lengths


def run(plan, run_dir, data, processor, context: int | None) -> None:
    """The policy stage's preflight (before the weights load): measure, check, print, record in the manifest."""
    lengths = prompt_lengths(plan, data, processor, context)
    log.info("%s", describe(lengths, plan))
    run_dir.update(prompt_lengths=lengths)


def _messages(row: dict, is_vlm: bool, completion: str | None = None) -> list[dict]:
    from harness.eval.greedy import prompt_messages

    out = prompt_messages(row, is_vlm)
    return out if completion is None else [*out, {"role": "assistant", "content": completion}]


def _tokenizer(processor):
    return getattr(processor, "tokenizer", processor)


def _tokenizer_digest(tok) -> str:
    """What the tokenizer does (vocabulary, merges, normalizer, pre-tokenizer, added tokens), as one digest."""
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    return f"{type(tok).__name__}:{hashlib.sha256(text.encode()).hexdigest()}"


def _key(plan, data, processor) -> dict:
    """What a measurement depends on: the dataset's content, the processor's template, tokenizer and image bounds,
    the splits measured. Each measured part's memo file is keyed by it and the part's name."""
    cfg = plan.cfg
    m, d = cfg.model, cfg.data
    tok = _tokenizer(processor)
    ip = getattr(processor, "image_processor", None)
    return {"v": PREFLIGHT_VERSION, "data": data.content_sha256,
            "template": getattr(processor, "chat_template", None) or tok.chat_template, "vocab": len(tok),
            "tok": _tokenizer_digest(tok), "ip": ip and {k: getattr(ip, k, None) for k in ("patch_size", "merge_size")},
            "size": ip and dict(ip.size), "pixels": [m.min_pixels, m.max_pixels],
            "splits": [d.train_split, d.eval_split, d.eval_max_items]}


def count_tokens(processor, root: Path, rows: list[dict], *, is_vlm: bool, completions: list[str] | None = None):
    """Per row: (tokens of the rendered prompt (+ completion) with every image pad expanded, image tokens)."""
    from PIL import Image

    from harness.models.pretrained import image_tokens

    tok = _tokenizer(processor)
    texts = [processor.apply_chat_template(_messages(r, is_vlm, None if completions is None else completions[i]),
                                           add_generation_prompt=completions is None, tokenize=False)
             for i, r in enumerate(rows)]
    lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    if not is_vlm:
        return [(n, 0) for n in lengths]
    ip = processor.image_processor
    bounds = dict(patch_size=ip.patch_size, merge_size=ip.merge_size, min_pixels=ip.size["shortest_edge"],
                  max_pixels=ip.size["longest_edge"])
    sizes: dict[str, int] = {}
    out = []
    for r, n in zip(rows, lengths):
        extra = 0
        for img in r["images"]:
            key = img.get("sha256") or img["path"]
            if key not in sizes:
                with Image.open(root / img["path"]) as im:
                    w, h = im.size
                sizes[key] = image_tokens(h, w, **bounds)
            extra += sizes[key]
        out.append((n - len(r["images"]) + extra, extra // max(1, len(r["images"]))))
    return out


def _stats(values: list[int]) -> dict:
    return {"min": min(values), "median": statistics.median_low(values), "max": max(values)} if values else {}


def _prompts(plan, data, processor) -> dict:
    from harness.data import row_key

    is_vlm = plan.cfg.model.is_vlm
    train = count_tokens(processor, data.root, data.train_rows, is_vlm=is_vlm)
    test = count_tokens(processor, data.root, data.test_rows, is_vlm=is_vlm)
    return {"train": [n for n, _ in train], "test": [n for n, _ in test],
            "train_keys": [row_key(r) for r in data.train_rows], "test_keys": [row_key(r) for r in data.test_rows],
            "image_tokens": sorted({k for _, k in train + test}) if is_vlm else []}


def _sft_rows(plan, data, processor) -> dict:
    from harness.rewards.answers import format_answer

    full = count_tokens(processor, data.root, data.train_rows, is_vlm=plan.cfg.model.is_vlm,
                        completions=[format_answer(r["target"]) for r in data.train_rows])
    return {"sft_rows": [n for n, _ in full]}


def _memoized(plan, data, processor, key: dict, part: str, measure) -> dict:
    from harness.rundir import atomic_write_json

    cache = Path(plan.cfg.output_root) / "cache" / "preflight"
    digest = hashlib.sha256(json.dumps({**key, "part": part}, sort_keys=True, default=str).encode()).hexdigest()
    path = cache / f"{digest[:24]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    measured = measure(plan, data, processor)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, measured)
    except OSError as err:  # a cache that cannot be written only costs the next run this measurement
        log.warning("preflight: could not cache the prompt lengths in %s (%s)", cache, err)
    return measured


def prompt_lengths(plan, data, processor, context: int | None) -> dict:
    """Measure (memoized: an RL arm after its warm start measures nothing), check and summarize; raises
    ConfigError when a prompt does not fit."""
    key = _key(plan, data, processor)
    measured = _memoized(plan, data, processor, key, "prompts", _prompts)
    if plan.kind.trains_on_rows:  # whole SFT rows (prompt + answer) must fit arm.max_length
        measured = {**measured, **_memoized(plan, data, processor, key, "sft_rows", _sft_rows)}
    check(plan, data, measured, context)
    return summary(plan, measured, context)


def check(plan, data, measured: dict, context: int | None) -> None:
    """ConfigError naming the knob when a prompt (or an SFT row) does not fit; the count, the worst item, the fix."""
    cfg = plan.cfg
    problems = []

    def worst(split: str, limit: int, field: str, value, what: str, fix: str, values: list[int] | None = None):
        values = measured[split] if values is None else values
        over = [i for i, n in enumerate(values) if n > limit]
        if over:
            i = max(over, key=values.__getitem__)
            key = measured["train_keys" if split == "train" else "test_keys"][i]
            problems.append(Problem(field, value, f"{len(over)} of {len(values)} {what}; the longest is {values[i]} "
                                                  f"tokens (record {key} of {data.root})", fix))

    if context:
        budget = plan.kind.sampled_tokens(cfg)
        if budget is not None:
            worst("train", context - budget, "arm.max_completion_length", budget,
                  f"training prompts plus this many sampled tokens exceed the model's context of {context} positions",
                  "lower model.max_pixels / model.min_pixels (fewer image tokens per image) or arm.max_completion_length, or drop the "
                  "longest records")
        eval_new = cfg.train.eval_max_new_tokens
        worst("test", context - eval_new, "train.eval_max_new_tokens", eval_new,
              f"eval prompts plus this many generated tokens exceed the model's context of {context} positions",
              "lower model.max_pixels or train.eval_max_new_tokens, or drop the longest records")
    if "sft_rows" in measured:
        max_len, need = cfg.arm.max_length, max(measured["sft_rows"]) + 1  # measured: the kind trains on rows
        worst("train", max_len - 1, "arm.max_length", max_len,
              "SFT rows (prompt + answer) reach it: TRL would cut them, through their answer or their image tokens",
              f"raise arm.max_length to at least {need} (the SFT warm start of an RL arm: "
              f"budget.sft_warm_start_max_length={need}), or lower model.max_pixels / model.min_pixels",
              measured["sft_rows"])
    if problems:
        raise ConfigError(problems)


def summary(plan, measured: dict, context: int | None) -> dict:
    out = {"train": {"n": len(measured["train"]), **_stats(measured["train"])},
           "eval": {"n": len(measured["test"]), **_stats(measured["test"])},
           "image_tokens_per_image": measured["image_tokens"], "context": context}
    if "sft_rows" in measured:
        out["sft_rows"] = {"n": len(measured["sft_rows"]), **_stats(measured["sft_rows"])}
    return out


def describe(s: dict, plan) -> str:
    """One line: the prompt lengths the run trains on, and how close the longest comes to a limit."""
    def span(d: dict) -> str:
        return f"{d['min']} tokens" if d["min"] == d["max"] else f"{d['min']}/{d['median']}/{d['max']} tokens (min/median/max)"

    t, img = s["train"], s["image_tokens_per_image"]
    parts = [f"prompts: {t['n']} train rows, {span(t)}" if t.get("n") else "prompts: no train rows"]
    if img:
        parts.append(f"{img[0]}{'-' + str(img[-1]) if len(img) > 1 else ''} image tokens per image")
    sampled = plan.kind.sampled_tokens(plan.cfg)
    if sampled is not None and t.get("n"):
        longest = t["max"] + sampled
        ctx = f" of the model's {s['context']} positions" if s.get("context") else ""
        parts.append(f"longest + arm.max_completion_length = {longest}{ctx}")
    if "sft_rows" in s:
        parts.append(f"SFT rows {span(s['sft_rows'])} below arm.max_length {plan.cfg.arm.max_length}")
    return "; ".join(parts)
