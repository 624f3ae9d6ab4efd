"""A Qwen-VL checkpoint in the exact layout of a Hugging Face hub snapshot, with seeded random weights: test data
for the pretrained path (`model=qwen model.path=DIR`), never downloaded, never a model the harness trains by default.

    python -m harness.models.snapshot DIR [--family qwen2_5_vl] [--shape tiny|3b] [--seed 0] [--device cpu]

What a snapshot of Qwen/Qwen2.5-VL-3B-Instruct (or Qwen2-VL-2B-Instruct, Qwen3-VL-4B-Instruct) holds, scaled down:

- config.json as the hub has it: the flat layout of transformers 4.4x for Qwen2-VL and Qwen2.5-VL (text fields at
  the top level, `rope_scaling: {"type": "mrope", ...}`), the nested one for Qwen3-VL; the real special-token ids.
- the weights as `model-0000k-of-0000n.safetensors` shards plus `model.safetensors.index.json`, under the hub's
  tensor names (`model.layers.*`, `visual.*`, `lm_head.weight`: transformers' original format).
- a Qwen2 tokenizer (`tokenizer.json`, `vocab.json`, `merges.txt`, `tokenizer_config.json` with
  `tokenizer_class: Qwen2Tokenizer`): byte-level BPE with Qwen2's pre-tokenizer, trained here on a small fixed
  corpus, then Qwen's added tokens in Qwen's order right after the regular vocabulary (`<|endoftext|>`,
  `<|im_start|>`, `<|im_end|>`, ..., `<|vision_start|>`, `<|vision_end|>`, `<|vision_pad|>`, `<|image_pad|>`,
  `<|video_pad|>`, ...). With `--shape 3b` the regular vocabulary is padded to Qwen's 151,643 entries, so every
  added token has its real id (`<|image_pad|>` = 151655) and every id below config.vocab_size (151,936) decodes.
- `preprocessor_config.json` (the stock Qwen2-VL image processor with the checkpoint's min_pixels / max_pixels and
  `processor_class`), `chat_template.json` (Qwen's template: image parts become
  `<|vision_start|><|image_pad|><|vision_end|>`; Qwen2/2.5-VL's default system prompt), `generation_config.json`
  with the real EOS list ([<|im_end|>, <|endoftext|>]) and the instruct checkpoints' sampling defaults
  (top_k=1, temperature 0.1, repetition_penalty 1.05: what must not leak into an arm's sampling).

Shapes: `tiny` (text hidden 128, 4 layers; vision width 64, depth 2; ~1 M parameters, a ~1,000-entry vocabulary)
for CPU tests; `3b` the dimensions of Qwen2.5-VL-3B-Instruct (3.75 B parameters with its 151,936-token
vocabulary; build it on a GPU: `--device cuda`, bf16). Deterministic: the same arguments give the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2")  # qwen2: a text-only Qwen2.5 instruct checkpoint
SHAPES = ("tiny", "3b")

#: Qwen's added tokens in their order (ids 151643.. in the released tokenizers); True = special.
ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)  # fmt: skip
QWEN3_EXTRA_TOKENS = (("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False))
QWEN_REGULAR_VOCAB = 151643  # Qwen2's byte-level BPE entries: the added tokens start here
QWEN_VOCAB_SIZE = 151936  # config.vocab_size of the released 2B-7B checkpoints (rows past the tokenizer unused)

QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)  # Qwen2-VL / Qwen2.5-VL instruct, as released

# Qwen3-VL instruct's structure (no default system prompt; image and video parts as Qwen2-VL's), without the
# tool-calling and reasoning branches the released template also has.
QWEN3_VL_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}{%- set video_count = namespace(value=0) -%}"
    "{%- macro render_content(content, do_vision_count) -%}{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for item in content -%}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' -%}"
    "{%- if do_vision_count -%}{%- set image_count.value = image_count.value + 1 -%}{%- endif -%}"
    "{%- if add_vision_id -%}Picture {{ image_count.value }}: {% endif -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif 'video' in item or item.type == 'video' -%}"
    "{%- if do_vision_count -%}{%- set video_count.value = video_count.value + 1 -%}{%- endif -%}"
    "{%- if add_vision_id -%}Video {{ video_count.value }}: {% endif -%}<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif 'text' in item -%}{{- item.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content, true) + '<|im_end|>\\n' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: A fixed corpus for the fixture's BPE (the tokenizer is byte-level: any text encodes; this only decides merges).
CORPUS = (
    "What color is the circle? What color is the square? What color is the triangle? What color is the diamond?",
    "Answer with <answer>...</answer>. <answer>red</answer> <answer>green</answer> <answer>blue</answer>",
    "<answer>yellow</answer> <answer>purple</answer> <answer>orange</answer> <answer></answer> <answer>none</answer>",
    "The quick brown fox jumps over the lazy dog. A picture of a shape on a grey background.",
    "Look at the image and answer the question. If the object is not visible, answer with an empty answer.",
    "one two three four five six seven eight nine ten 0 1 2 3 4 5 6 7 8 9 10 100 left right top bottom middle",
)


def _shape(family: str, shape: str) -> dict:
    """Text and vision dimensions, ids layout and the image processor's pixel bounds."""
    if shape == "3b":
        if family != "qwen2_5_vl":
            raise ValueError(f"--shape 3b is Qwen2.5-VL-3B-Instruct's; for family {family} use --shape tiny")
        return dict(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vision_hidden=1280,
                    vision_depth=32, vision_heads=16, vision_intermediate=3420, fullatt=[7, 15, 23, 31],
                    regular_vocab=QWEN_REGULAR_VOCAB, vocab_size=QWEN_VOCAB_SIZE, max_positions=128000)  # fmt: skip
    return dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=256, vision_hidden=64, vision_depth=2,
                vision_heads=4, vision_intermediate=128, fullatt=[1], regular_vocab=960, vocab_size=1024,
                max_positions={"qwen2_vl": 32768, "qwen2_5_vl": 128000, "qwen3_vl": 262144, "qwen2": 32768}[family])  # fmt: skip


def added_tokens(family: str) -> tuple:
    return ADDED_TOKENS + (QWEN3_EXTRA_TOKENS if family == "qwen3_vl" else ())


def token_ids(family: str, regular_vocab: int) -> dict[str, int]:
    return {tok: regular_vocab + i for i, (tok, _) in enumerate(added_tokens(family))}


# --- the tokenizer


def build_tokenizer_files(out: Path, family: str, regular_vocab: int) -> None:
    """tokenizer.json, vocab.json, merges.txt and tokenizer_config.json in the hub's form."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    from harness.models.tokenizer import PRETOKENIZE_REGEX

    def configure(tok):
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        return tok

    trained = configure(Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False)))
    trainer = BpeTrainer(vocab_size=min(regular_vocab, 4096), min_frequency=1, special_tokens=[],
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    trained.train_from_iterator(sorted(CORPUS), trainer=trainer)
    model = json.loads(trained.to_str())["model"]
    vocab, merges = dict(model["vocab"]), [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    # Pad to the regular vocabulary's size with entries no merge produces (they still decode: letters only), as
    # Qwen's 151,643 entries are far more than this corpus yields. The added tokens come right after.
    n = 0
    while len(vocab) < regular_vocab:
        filler = "zz" + _letters(n)
        n += 1
        if filler not in vocab:
            vocab[filler] = len(vocab)
    tok = configure(Tokenizer(BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], unk_token=None,
                                  fuse_unk=False, byte_fallback=False, dropout=None)))  # fmt: skip
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added_tokens(family)])
    tok.save(str(out / "tokenizer.json"))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    ids = token_ids(family, regular_vocab)
    decoder = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": s} for t, s in added_tokens(family)}  # fmt: skip
    config = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": decoder,
        "additional_special_tokens": [t for t, s in ADDED_TOKENS[1:14]], "bos_token": None,
        "chat_template": _template(family), "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip
    _write_json(out / "tokenizer_config.json", config)


def _letters(n: int) -> str:
    s = ""
    while True:
        s = "abcdefghijklmnopqrstuvwxyz"[n % 26] + s
        n //= 26
        if not n:
            return s


# Qwen2.5 instruct (text-only), without its tool-calling branch.
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n' }}{%- endif %}{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def _template(family: str) -> str:
    return {"qwen3_vl": QWEN3_VL_TEMPLATE, "qwen2": QWEN2_TEMPLATE}.get(family, QWEN2_VL_TEMPLATE)


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- config, processor files, generation config


def config_json(family: str, dims: dict, ids: dict[str, int], dtype: str) -> dict:
    """config.json as the hub has it for the family (flat for Qwen2/2.5-VL, nested for Qwen3-VL)."""
    head_dim = dims["hidden"] // dims["heads"]
    half = head_dim // 2
    common_ids = {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
                  "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"]}
    if family == "qwen3_vl":
        hw = half * 5 // 16  # Qwen3-VL's [24, 20, 20] at head_dim 128
        text = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": ids["<|im_end|>"], "head_dim": head_dim, "hidden_act": "silu",
                "hidden_size": dims["hidden"], "initializer_range": 0.02, "intermediate_size": dims["intermediate"],
                "max_position_embeddings": dims["max_positions"], "model_type": "qwen3_vl_text",
                "num_attention_heads": dims["heads"], "num_hidden_layers": dims["layers"],
                "num_key_value_heads": dims["kv_heads"], "rms_norm_eps": 1e-06,
                "rope_scaling": {"mrope_interleaved": True, "mrope_section": [half - 2 * hw, hw, hw],
                                 "rope_type": "default"},
                "rope_theta": 5000000, "use_cache": True, "vocab_size": dims["vocab_size"], "dtype": dtype}
        vision = {"deepstack_visual_indexes": [0], "depth": dims["vision_depth"], "hidden_act": "gelu_pytorch_tanh",
                  "hidden_size": dims["vision_hidden"], "in_channels": 3, "initializer_range": 0.02,
                  "intermediate_size": dims["vision_intermediate"], "model_type": "qwen3_vl",
                  "num_heads": dims["vision_heads"], "num_position_embeddings": 256,
                  "out_hidden_size": dims["hidden"], "patch_size": 16, "spatial_merge_size": 2,
                  "temporal_patch_size": 2}
        return {"architectures": ["Qwen3VLForConditionalGeneration"], **common_ids, "model_type": "qwen3_vl",
                "text_config": text, "tie_word_embeddings": True, "transformers_version": "4.57.0.dev0",
                "vision_config": vision}
    if family == "qwen2":
        return {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": ids["<|im_end|>"], "hidden_act": "silu", "hidden_size": dims["hidden"],
                "initializer_range": 0.02, "intermediate_size": dims["intermediate"],
                "max_position_embeddings": 32768, "max_window_layers": dims["layers"], "model_type": "qwen2",
                "num_attention_heads": dims["heads"], "num_hidden_layers": dims["layers"],
                "num_key_value_heads": dims["kv_heads"], "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": dtype,
                "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False,
                "vocab_size": dims["vocab_size"]}
    t = half // 4
    section = [t, (half - t) // 2, half - t - (half - t) // 2]  # [16, 24, 24] at head_dim 128
    flat = {"architectures": [], "attention_dropout": 0.0, "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"], **common_ids, "vision_token_id": ids["<|vision_pad|>"],
            "hidden_act": "silu", "hidden_size": dims["hidden"], "initializer_range": 0.02,
            "intermediate_size": dims["intermediate"], "max_position_embeddings": dims["max_positions"],
            "max_window_layers": dims["layers"], "model_type": family, "num_attention_heads": dims["heads"],
            "num_hidden_layers": dims["layers"], "num_key_value_heads": dims["kv_heads"], "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": dtype,
            "transformers_version": "4.41.2", "use_cache": True, "use_sliding_window": False}
    if family == "qwen2_vl":
        flat["architectures"] = ["Qwen2VLForConditionalGeneration"]
        flat["vision_config"] = {"depth": dims["vision_depth"], "embed_dim": dims["vision_hidden"], "mlp_ratio": 4,
                                 "num_heads": dims["vision_heads"], "in_chans": 3, "hidden_size": dims["hidden"],
                                 "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                                 "temporal_patch_size": 2}
    else:
        flat["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
        flat["vision_config"] = {"depth": dims["vision_depth"], "hidden_act": "silu",
                                 "hidden_size": dims["vision_hidden"], "intermediate_size": dims["vision_intermediate"],
                                 "num_heads": dims["vision_heads"], "in_chans": 3, "out_hidden_size": dims["hidden"],
                                 "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14,
                                 "window_size": 112, "fullatt_block_indexes": dims["fullatt"], "tokens_per_second": 2,
                                 "temporal_patch_size": 2}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": section}
    flat["vocab_size"] = dims["vocab_size"]
    return flat


PROCESSOR_CLASS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def preprocessor_json(family: str) -> dict:
    if family == "qwen3_vl":
        return {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast"}
    return {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": PROCESSOR_CLASS[family]}


def video_preprocessor_json() -> dict:  # Qwen3-VL ships one; Qwen2/2.5-VL derive theirs from preprocessor_config
    return {"size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor"}


def generation_json(family: str, ids: dict[str, int]) -> dict:
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    if family in ("qwen3_vl", "qwen2"):
        return {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"], "do_sample": True,
                "eos_token_id": eos, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.0, "temperature": 0.7,
                "transformers_version": "4.56.0"}
    return {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"], "do_sample": True,
            "eos_token_id": eos, "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1,
            "transformers_version": "4.37.0"}


# --- weights


def _write_weights(out: Path, family: str, config: dict, *, seed: int, device: str, dtype: str,
                   shard_bytes: int) -> int:
    """Seeded random weights under the hub's tensor names, sharded with an index; returns the parameter count."""
    import torch
    from transformers import AutoConfig

    tmp_cfg = Path(tempfile.mkdtemp(prefix=".config-", dir=out))
    try:
        _write_json(tmp_cfg / "config.json", config)
        cfg = AutoConfig.from_pretrained(tmp_cfg)
    finally:
        shutil.rmtree(tmp_cfg)
    cls = _model_class(family)
    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    with torch.device(device):
        model = cls(cfg).to(torch_dtype).eval()
    n = sum(p.numel() for p in model.parameters())
    # save_original_format (the default) writes the hub's names; max_shard_size splits into shards + an index
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=shard_bytes)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return n


def _model_class(family: str):
    import transformers

    return {"qwen2": transformers.Qwen2ForCausalLM, "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
            "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
            "qwen3_vl": transformers.Qwen3VLForConditionalGeneration}[family]


def build_snapshot(out: str | os.PathLike, *, family: str = "qwen2_5_vl", shape: str = "tiny", seed: int = 0,
                   device: str = "cpu", dtype: str | None = None, max_positions: int | None = None) -> Path:
    """Write a hub-layout checkpoint into `out` (created; must be empty or absent). Returns its path.

    `dtype` defaults to float32 for tiny (CPU tests) and bfloat16 for 3b; config.json records it as the hub does
    (`torch_dtype`). `max_positions` overrides the context length (tests of the prompt-length preflight)."""
    if family not in FAMILIES:
        raise ValueError(f"family ({family!r}) must be one of {list(FAMILIES)}")
    if shape not in SHAPES:
        raise ValueError(f"shape ({shape!r}) must be one of {list(SHAPES)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; give a new directory")
    dims = _shape(family, shape)
    if max_positions:
        dims["max_positions"] = int(max_positions)
    dtype = dtype or ("bfloat16" if shape == "3b" else "float32")
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    try:
        ids = token_ids(family, dims["regular_vocab"])
        config = config_json(family, dims, ids, dtype)
        _write_weights(tmp, family, config, seed=seed, device=device, dtype=dtype,
                       shard_bytes=2_000_000_000 if shape == "3b" else 2_000_000)  # tiny: 2 shards, as the hub
        _write_json(tmp / "config.json", config)  # the hub's layout, not transformers 5's re-serialization
        _write_json(tmp / "generation_config.json", generation_json(family, ids))
        build_tokenizer_files(tmp, family, dims["regular_vocab"])
        if family != "qwen2":  # a text-only checkpoint: the template lives in tokenizer_config.json only
            _write_json(tmp / "preprocessor_config.json", preprocessor_json(family))
            _write_json(tmp / "chat_template.json", {"chat_template": _template(family)})
        if family == "qwen3_vl":
            _write_json(tmp / "video_preprocessor_config.json", video_preprocessor_json())
        for p in tmp.iterdir():
            p.chmod(0o644)  # as a hub download leaves them (safetensors writes 0600)
        tmp.chmod(0o755)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.models.snapshot", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="directory to create (empty or absent)")
    p.add_argument("--family", default="qwen2_5_vl", choices=FAMILIES)
    p.add_argument("--shape", default="tiny", choices=SHAPES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random weights are made (cuda for --shape 3b)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    args = p.parse_args(argv)
    try:
        path = build_snapshot(args.out, family=args.family, shape=args.shape, seed=args.seed, device=args.device,
                              dtype=args.dtype)
    except (ValueError, FileExistsError, OSError) as err:
        print(f"harness.models.snapshot: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
