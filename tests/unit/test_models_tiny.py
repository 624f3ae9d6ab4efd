"""Tiny local models (harness.models): tokenizer contract, deterministic atomic cached builds,
bitwise reload under the in-memory key names, the image-only processor (4 image tokens per
56x56 / 64x64 image), suppressed vision tokens, AutoProcessor in a fresh process, and one TRL
GRPO / SFT step per model that must change its parameters.

Every model is built once per session into a tmp cache (~0.05 s each after the imports).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from harness.models import tiny as tiny_mod

import torch  # noqa: E402  (the project's own dependencies: a broken install must fail, not skip)
import transformers  # noqa: E402,F401

TINY = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256,
            vision_width=64, vision_depth=2, vocab_size=512, init_seed=0)  # fmt: skip
COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]
SHAPES = ["circle", "square", "triangle", "star"]
CORPUS = (
    [f"What color is the {s}? Answer with <answer>color</answer>." for s in SHAPES]
    + [f"<answer>{c}</answer>" for c in COLORS + ["unknown"]]
    + [f"The {c} {s} is left of the {s2}." for c in COLORS for s in SHAPES for s2 in SHAPES]
    + ["Options: (A) 3.5 (B) -2 (C) naïve café — 你好 😀"]
)
FAMILIES = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16, "qwen2": 14}
VLMS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


def _build(family: str, cache_dir, **over):
    return tiny_mod.build_tiny(family=family, is_vlm=family != "qwen2", patch_size=FAMILIES[family],
                               tiny={**TINY, **over}, corpus=CORPUS, cache_dir=cache_dir)  # fmt: skip


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def built(cache):
    return {fam: _build(fam, cache) for fam in FAMILIES}


def _image(side: int, seed: int = 0):
    from PIL import Image

    rng = random.Random(seed)
    return Image.new("RGB", (side, side), tuple(rng.randrange(256) for _ in range(3)))


# --- import boundary


def test_import_is_torch_free():
    code = "import sys, harness.models; print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# --- tokenizer


def test_tokenizer_byte_level_specials_and_padding():
    from harness.models.tokenizer import SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer(CORPUS, 512)
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(len(SPECIAL_TOKENS)))
    assert (tok.pad_token, tok.eos_token, tok.padding_side) == ("<|endoftext|>", "<|im_end|>", "left")
    # Every corpus character, and text the corpus never saw, round-trips without an unknown token.
    for text in ["".join(sorted(set("".join(CORPUS)))), "Zebra ÆØÅ ∑ 🙂\t\n  x", *CORPUS]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    # <answer> tags are ordinary text: they survive skip_special_tokens (TRL decodes that way).
    ids = tok.encode("<|im_start|>assistant\n<answer>red</answer><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<answer>red</answer>"
    assert "<answer>" not in tok.all_special_tokens
    batch = tok(["<answer>red</answer>", "red"], padding=True)
    assert batch["input_ids"][1][0] == tok.pad_token_id  # left padding


def test_tokenizer_is_order_and_repetition_invariant():
    from harness.models.tokenizer import build_tokenizer

    a = build_tokenizer(CORPUS, 512).backend_tokenizer.to_str()
    b = build_tokenizer(list(reversed(CORPUS)) + CORPUS[:5], 512).backend_tokenizer.to_str()
    assert a == b


@pytest.mark.parametrize("content", [
    "What color is the circle?",
    [{"type": "image"}, {"type": "text", "text": "What color is the circle?"}],
    [{"type": "text", "text": "Left:"}, {"type": "image"}, {"type": "text", "text": "right?"}, {"type": "image"}],
])  # fmt: skip
def test_chat_template_prompt_is_a_prefix_of_prompt_plus_completion(content):
    from harness.models.tokenizer import build_tokenizer

    tok = build_tokenizer(CORPUS, 512)
    prompt = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": content}]
    completion = [{"role": "assistant", "content": "<answer>red</answer>"}]
    p = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    pc = tok.apply_chat_template(prompt + completion, tokenize=False)
    assert pc.startswith(p) and pc[len(p):] == "<answer>red</answer><|im_end|>\n"
    assert p.endswith("<|im_start|>assistant\n")
    n_images = 0 if isinstance(content, str) else sum(part["type"] == "image" for part in content)
    assert p.count("<|vision_start|><|image_pad|><|vision_end|>") == n_images
    p_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    pc_out = tok.apply_chat_template(prompt + completion, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert pc_out["input_ids"][: len(p_ids)] == p_ids  # token-level prefix too (TRL's completion mask)
    masked = [i for i, m in zip(pc_out["input_ids"], pc_out["assistant_masks"]) if m]
    assert tok.decode(masked) == "<answer>red</answer><|im_end|>"


# --- build, cache, identity


def test_build_writes_manifest_and_hits_the_cache(cache, built):
    path = built["qwen2_vl"]
    assert path.parent == cache and path.name.startswith("tiny-qwen2_vl-")
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "processor_config.json",
            "chat_template.jinja", "harness_model.json"} <= names  # fmt: skip
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "temp dirs left behind"
    ident = tiny_mod.model_identity(path, verify=True)
    assert ident["verified"] and ident["architecture"] == "Qwen2VLForConditionalGeneration"
    assert ident["params"]["tiny"] == TINY and len(ident["files_sha256"]) == 64
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert _build("qwen2_vl", cache) == path  # cache hit: same dir, not rewritten
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    other = _build("qwen2_vl", cache, init_seed=1)
    assert other != path
    assert tiny_mod.model_identity(other)["files_sha256"] != ident["files_sha256"]
    # Text-only: vision fields and patch size do not key the cache.
    assert tiny_mod.tiny_key(family="qwen2", is_vlm=False, patch_size=16, tiny={**TINY, "vision_width": 32},
                             corpus=CORPUS)["key"] == tiny_mod.model_identity(built["qwen2"])["key"]  # fmt: skip


def test_tampered_cache_is_refused(cache, built, tmp_path):
    copy = tmp_path / built["qwen2"].name
    shutil.copytree(built["qwen2"], copy)
    with open(copy / "config.json", "a") as fh:
        fh.write(" ")
    with pytest.raises(tiny_mod.ModelCacheError, match="config.json: sha256"):
        tiny_mod.model_identity(copy, verify=True)
    with pytest.raises(tiny_mod.ModelCacheError, match="config.json"):
        tiny_mod.build_tiny(family="qwen2", is_vlm=False, patch_size=14, tiny=TINY, corpus=CORPUS, cache_dir=tmp_path)
    (copy / "harness_model.json").unlink()  # a half-written dir: never taken for a build
    with pytest.raises(tiny_mod.ModelCacheError, match="not a complete"):
        tiny_mod.model_identity(copy)


def test_losing_the_publish_race_uses_the_winners_copy(built, tmp_path, monkeypatch):
    real = tiny_mod._write_build
    target = tmp_path / built["qwen2"].name

    def racing(tmp, params, lines):
        fields = real(tmp, params, lines)
        shutil.copytree(built["qwen2"], target)  # a concurrent builder publishes first
        return fields

    monkeypatch.setattr(tiny_mod, "_write_build", racing)
    got = tiny_mod.build_tiny(family="qwen2", is_vlm=False, patch_size=14, tiny=TINY, corpus=CORPUS, cache_dir=tmp_path)
    assert got == target and [p.name for p in tmp_path.iterdir()] == [target.name]
    assert tiny_mod.model_identity(got, verify=True)["files_sha256"] == tiny_mod.model_identity(built["qwen2"])["files_sha256"]


def test_a_manifestless_dir_at_the_target_is_never_taken_for_a_build(built, tmp_path):
    target = tmp_path / built["qwen2"].name
    target.mkdir()
    (target / "config.json").write_text("{}")  # e.g. an interrupted manual copy
    with pytest.raises(tiny_mod.ModelCacheError, match="not a complete build"):
        tiny_mod.build_tiny(family="qwen2", is_vlm=False, patch_size=14, tiny=TINY, corpus=CORPUS, cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # our temp dir was cleaned up


@pytest.mark.parametrize("kwargs, message", [
    (dict(family="qwen2", is_vlm=True), "contradicts"),
    (dict(family="qwen2_vl", tiny={**TINY, "head_dim": 16}), "must equal hidden_size/num_heads"),
    (dict(family="qwen3_vl", tiny={**TINY, "num_kv_heads": 3}), "must divide"),
    (dict(family="llama"), "must be one of"),
    (dict(family="qwen2_vl", tiny={**TINY, "depth": 3}), "unknown fields \\['depth'\\]"),
])  # fmt: skip
def test_bad_build_parameters_are_refused(kwargs, message):
    args = dict(family="qwen2_vl", is_vlm=kwargs.get("family", "qwen2_vl") != "qwen2", patch_size=14, tiny=TINY)
    with pytest.raises(ValueError, match=message):
        tiny_mod.build_params(**{**args, **kwargs})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sizes_and_bitwise_reload_under_in_memory_names(built, family):
    from safetensors.torch import load_file

    model, processing = tiny_mod.load_tiny(built[family])
    n = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n < 1.5e6, n
    assert n == tiny_mod.model_identity(built[family])["num_parameters"]
    on_disk = load_file(built[family] / "model.safetensors")
    in_memory = model.state_dict()
    assert set(on_disk) == set(in_memory)  # in-memory names on disk (no visual.* / model.layers.* renames)
    assert all(torch.equal(on_disk[k], in_memory[k]) for k in on_disk)
    text = model.config.get_text_config()
    assert text.hidden_size // text.num_attention_heads == TINY["head_dim"] and text.num_key_value_heads == 2
    if family != "qwen2":
        assert sum(text.rope_parameters["mrope_section"]) == TINY["head_dim"] // 2
    gen = model.generation_config
    tok = getattr(processing, "tokenizer", processing)
    from harness.models.tokenizer import build_tokenizer

    fresh = build_tokenizer(CORPUS, TINY["vocab_size"])  # the reloaded class may differ (Qwen2Tokenizer), not the ids
    for text in [*CORPUS, "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Zebra 🙂<|im_end|>\n"]:
        assert tok.encode(text, add_special_tokens=False) == fresh.encode(text, add_special_tokens=False)
    assert tok.padding_side == "left" and tok.chat_template == fresh.chat_template
    assert (gen.eos_token_id, gen.pad_token_id) == (tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id)


@pytest.mark.parametrize("first", ["harness.models", "transformers"])
def test_fresh_process_rebuilds_identical_files_and_autoprocessor_reloads(built, tmp_path, first):
    """A second process rebuilds byte-identical files (different hash seed) and reloads the processor
    with the stock AutoProcessor, whichever of harness.models and transformers it imports first."""
    imports = ["import harness.models as hm", "from transformers import AutoProcessor, AutoModelForImageTextToText"]
    code = "\n".join(imports if first == "harness.models" else imports[::-1]) + textwrap.dedent(f"""
        import json
        proc = AutoProcessor.from_pretrained({str(built['qwen2_vl'])!r})
        AutoModelForImageTextToText.from_pretrained({str(built['qwen2_vl'])!r})
        path = hm.build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny={TINY!r},
                             corpus={CORPUS!r}, cache_dir={str(tmp_path)!r})
        print(json.dumps({{"processor": type(proc).__name__, "image_processor": type(proc.image_processor).__name__,
                          "identity": hm.model_identity(path, verify=True)}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "123"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "could not register" not in out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["processor"] == "HarnessVLProcessor"
    assert got["image_processor"] == "Qwen2VLImageProcessorPil"
    here = tiny_mod.model_identity(built["qwen2_vl"])
    assert got["identity"]["files_sha256"] == here["files_sha256"] and got["identity"]["key"] == here["key"]


# --- processor and generation


@pytest.mark.parametrize("family", VLMS)
def test_processor_gives_four_image_tokens_and_refuses_video(built, family):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(built[family])
    assert type(proc).__name__ == "HarnessVLProcessor" and not hasattr(proc, "video_processor")
    side = 4 * FAMILIES[family]  # 56 or 64: a 4x4 patch grid, 2x2 after the merge
    msgs = [[{"role": "user", "content": [{"type": "image", "image": _image(side, i)},
                                         {"type": "text", "text": "What color is the star?"}]}] for i in range(2)]  # fmt: skip
    out = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True,
                                   return_tensors="pt")  # fmt: skip
    assert (out["input_ids"] == proc.image_token_id).sum(1).tolist() == [4, 4]
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    assert out["mm_token_type_ids"].sum().item() == 8  # M-RoPE positions for the image tokens
    with pytest.raises(ValueError, match="image-only"):
        proc(text=["hi"], videos=[[_image(side)]])


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2"])
def test_generation_never_samples_vision_tokens(built, family):
    from harness.models.tokenizer import NEVER_SAMPLED

    model, processing = tiny_mod.load_tiny(built[family])
    tok = getattr(processing, "tokenizer", processing)
    ids = tiny_mod.special_token_ids_to_suppress(processing)
    assert ids == sorted(tok.convert_tokens_to_ids(list(NEVER_SAMPLED)))
    assert ids == tiny_mod.special_token_ids_to_suppress(tok)
    assert sorted(model.generation_config.suppress_tokens) == ids
    with torch.no_grad():
        # Push the logits of the banned ids up so an unsuppressed sampler would pick them.
        model.lm_head.weight[ids] += 5.0
        prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)  # fmt: skip
        torch.manual_seed(0)
        out = model.generate(**prompt, do_sample=True, max_new_tokens=16, num_return_sequences=8)
    assert not set(out[:, prompt["input_ids"].shape[1]:].flatten().tolist()) & set(ids)


# --- TRL end to end


def _changed(model, before) -> list[str]:
    return [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]


def _rows(vlm: bool, side: int, completion: bool) -> list[dict]:
    rows = []
    for i in range(4):
        row = {"prompt": [{"role": "user", "content": f"What color is the {SHAPES[i]}?"}]}
        if completion:
            row["completion"] = [{"role": "assistant", "content": f"<answer>{COLORS[i]}</answer>"}]
        if vlm:
            row["image"] = _image(side, i)
        rows.append(row)
    return rows


def _varied_reward(completions, **kwargs):
    # Varied within each group of 4: a constant reward has zero advantage and moves nothing.
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2"])
def test_one_grpo_step_changes_every_parameter(built, family, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, processing = tiny_mod.load_tiny(built[family])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=1,
        learning_rate=1e-3, logging_steps=1, mask_truncated_completions=False,  # random models rarely stop
        generation_kwargs={"suppress_tokens": tiny_mod.special_token_ids_to_suppress(processing)},
    )  # fmt: skip
    data = Dataset.from_list(_rows(family != "qwen2", 4 * FAMILIES[family], completion=False))
    trainer = GRPOTrainer(model=model, reward_funcs=_varied_reward, args=args, train_dataset=data,
                          processing_class=processing)  # fmt: skip
    trainer.train()
    changed = _changed(model, before)
    assert len(changed) == len(before), sorted(set(before) - set(changed))  # vision tower too: images reached it


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2"])
def test_one_sft_step_on_prompt_completion_records(built, family, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, processing = tiny_mod.load_tiny(built[family])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0,
                     per_device_train_batch_size=4, max_steps=1, learning_rate=1e-3, logging_steps=1)  # fmt: skip
    data = Dataset.from_list(_rows(family != "qwen2", 4 * FAMILIES[family], completion=True))
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=processing)
    batch = next(iter(trainer.get_train_dataloader()))
    labels = batch["labels"][batch["labels"] != -100]
    tok = getattr(processing, "tokenizer", processing)
    assert "<answer>" in tok.decode(labels) and "What color" not in tok.decode(labels)  # completion-only loss
    trainer.train()
    changed = _changed(model, before)
    assert len(changed) == len(before), sorted(set(before) - set(changed))
