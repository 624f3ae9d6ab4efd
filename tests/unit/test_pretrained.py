"""model.source=pretrained before any training: the hub-layout fixture is what a hub snapshot is, a checkpoint the
harness cannot load is refused at plan time with the field and the fix, the image-token arithmetic is the
processor's, identity follows the files, and the new fields keep every existing run's name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.errors import ConfigError

QWEN = ("model=qwen", "model.dtype=float32")


def _problems(plan_of, *overrides) -> list:
    with pytest.raises(ConfigError) as exc:
        plan_of(*QWEN, *overrides)
    return exc.value.problems


# --- the fixture is a hub snapshot


def test_the_fixture_has_the_hub_layout_and_loads_strictly_into_the_genuine_classes(hub_snapshot):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    path = hub_snapshot()
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
            "preprocessor_config.json", "chat_template.json"} <= names
    cfg = json.loads((path / "config.json").read_text())
    assert "text_config" not in cfg and cfg["rope_scaling"]["type"] == "mrope"  # transformers 4.4x's flat form
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.startswith("visual.") for k in index) and any(k.startswith("model.layers.") for k in index)
    model, info = AutoModelForImageTextToText.from_pretrained(path, output_loading_info=True)
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensor
    tok = AutoTokenizer.from_pretrained(path)
    assert type(tok).__name__ == "Qwen2Tokenizer" and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                                     "<|vision_end|>", "<|image_pad|>"])
    first = ids[0]
    assert ids == [first, first + 1, first + 2, first + 9, first + 10, first + 12]  # Qwen's order (151643, ...)
    assert cfg["image_token_id"] == ids[5] and cfg["vocab_size"] > len(tok)  # rows past the tokenizer, as released
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [ids[2], ids[0]] and gen["top_k"] == 1 and gen["repetition_penalty"] == 1.05
    assert type(AutoImageProcessor.from_pretrained(path)).__name__.startswith("Qwen2VLImageProcessor")
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
                                   add_generation_prompt=True, tokenize=False,
                                   chat_template=json.loads((path / "chat_template.json").read_text())["chat_template"])
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "<|vision_start|><|image_pad|><|vision_end|>Q?<|im_end|>\n<|im_start|>assistant\n")


def test_the_stock_processor_needs_torchvision_and_the_harness_builds_the_same_class_without_it(hub_snapshot):
    from harness.models.pretrained import load_processor, video_backend

    proc = load_processor(hub_snapshot())
    assert type(proc).__name__ == "Qwen2_5_VLProcessor" and type(proc).__mro__[1].__module__.startswith("transformers.")
    assert proc.tokenizer.padding_side == "left"
    if not video_backend():
        assert getattr(type(proc), "harness_image_only", False) and not hasattr(proc, "video_processor")
        with pytest.raises(ValueError, match="image-only"):
            proc(text=["x"], videos=[[]])


# --- refused at plan time, torch-free


def test_a_missing_path_a_file_and_a_folder_without_config_json_are_refused(plan_of, tmp_path, hub_snapshot):
    (tmp_path / "empty").mkdir()
    for path, why in ((tmp_path / "nope", "does not exist"), (hub_snapshot() / "config.json", "is a file"),
                      (tmp_path / "empty", "has no config.json")):
        (p,) = _problems(plan_of, f"model.path={path}")
        assert p.field == "model.path" and p.value == str(path) and why in p.why and p.fix


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_unknown_architecture_is_refused_with_what_is_supported(plan_of, tmp_path, hub_snapshot):
    d = _copy(hub_snapshot(), tmp_path / "llava")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "llava", "architectures": ["LlavaForX"]}))
    (p,) = _problems(plan_of, f"model.path={d}")
    assert p.field == "model.path" and "model_type='llava'" in p.why and "qwen2_5_vl" in p.fix


def test_a_text_only_checkpoint_with_is_vlm_true_is_refused(plan_of, hub_snapshot):
    (p,) = _problems(plan_of, f"model.path={hub_snapshot('qwen2')}")
    assert p.field == "model.is_vlm" and "text-only" in p.why and "model.is_vlm=false model.family=qwen2" in p.fix


def test_another_family_names_both_fields_to_set(plan_of, hub_snapshot):
    (p,) = _problems(plan_of, f"model.path={hub_snapshot('qwen3_vl')}")
    assert p.field == "model.family" and p.fix == "set model.family=qwen3_vl model.patch_size=16"


@pytest.mark.parametrize("damage, why", [
    (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "has no weights"),
    (lambda d: [(d / n).unlink() for n in ("tokenizer.json", "vocab.json")], "has no tokenizer"),
    (lambda d: (d / "preprocessor_config.json").unlink(), "without preprocessor_config.json"),
    (lambda d: (d / "preprocessor_config.json").write_text("{"), "unreadable preprocessor_config.json"),
    (lambda d: [(d / "chat_template.json").unlink(), (d / "tokenizer_config.json").write_text(json.dumps(
        {k: v for k, v in json.loads((d / "tokenizer_config.json").read_text()).items() if k != "chat_template"}))],
     "has no chat template"),
])
def test_an_incomplete_checkpoint_is_refused_with_what_is_missing(plan_of, tmp_path, hub_snapshot, damage, why):
    d = _copy(hub_snapshot(), tmp_path / "ckpt")
    damage(d)
    problems = _problems(plan_of, f"model.path={d}")
    assert any(p.field == "model.path" and why in p.why for p in problems), [p.why for p in problems]


def test_pixel_bounds_that_contradict_each_other_or_the_checkpoint_are_refused(plan_of, hub_snapshot):
    (p,) = _problems(plan_of, f"model.path={hub_snapshot()}", "model.min_pixels=5000", "model.max_pixels=100")
    assert p.field == "model.min_pixels"
    (p,) = _problems(plan_of, f"model.path={hub_snapshot('qwen3_vl')}", "model.family=qwen3_vl",
                     "model.patch_size=16", "model.max_pixels=50176")  # Qwen3-VL's own min_pixels is 65536
    assert p.field == "model.max_pixels" and "65536" in p.why


def test_planning_a_checkpoint_imports_no_torch(hub_snapshot, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO, heavy_imports

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", *QWEN, f"model.path={hub_snapshot()}",
                           "mode=plan", f"output_root={tmp_path}"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "harness.models.pretrained" in proc.stderr  # the checkpoint was read in this process
    assert heavy_imports(proc.stderr) == []
    assert json.loads(proc.stdout)["identity"]["model"]["files_sha256"]


# --- identity


def test_identity_and_run_name_follow_the_checkpoint_files(plan_of, tmp_path, hub_snapshot):
    a = plan_of(*QWEN, f"model.path={hub_snapshot()}")
    ident = a.identity["model"]
    assert ident["kind"] == "pretrained" and ident["hub_id"] is None and ident["model_type"] == "qwen2_5_vl"
    assert "model-00001-of-00002.safetensors" in ident["files"]
    assert a.run_name.startswith(f"grpo-qwen_{ident['files_sha256'][:8]}-lora-synthetic-s0-")
    assert a.parent.identity["model"]["files_sha256"] == ident["files_sha256"]
    d = _copy(hub_snapshot(), tmp_path / "copy")
    assert plan_of(*QWEN, f"model.path={d}").run_name == a.run_name  # the same files elsewhere: the same run
    cfg = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**cfg, "temperature": 0.2}))
    b = plan_of(*QWEN, f"model.path={d}")
    assert b.identity["model"]["files_sha256"] != ident["files_sha256"] and b.run_name != a.run_name


def test_weights_are_hashed_once_then_memoized_and_hub_blobs_by_their_name(tmp_path, monkeypatch):
    from harness.models import pretrained

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "MEMO_MIN_BYTES", 1)
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x" * 1000)
    import hashlib

    want = hashlib.sha256(b"x" * 1000).hexdigest()
    assert pretrained.file_sha256(f) == (want, "hashed")
    assert pretrained.file_sha256(f) == (want, "memoized")
    f.write_bytes(b"y" * 1000)  # a new mtime: hashed again
    assert pretrained.file_sha256(f)[0] == hashlib.sha256(b"y" * 1000).hexdigest()
    blob = tmp_path / "blobs" / ("a" * 64)
    blob.parent.mkdir()
    blob.write_bytes(b"z")
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "model.safetensors").symlink_to(blob)
    assert pretrained.file_sha256(tmp_path / "snap" / "model.safetensors") == ("a" * 64, "hub blob name")


def test_the_hub_cache_snapshot_is_the_one_refs_main_names(tmp_path, monkeypatch):
    from harness.config.checks import find_cached_snapshot

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--Qwen--X"
    for rev in ("old", "new"):
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "snapshots" / rev / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("old\n")
    assert find_cached_snapshot("Qwen/X") == repo / "snapshots" / "old"


def test_the_new_fields_at_null_keep_every_existing_run_name(plan_of):
    """model.min_pixels / max_pixels and budget.sft_warm_start_max_length came after runs existed: at null they are
    left out of both hashes (identity.OMIT_AT_DEFAULT), so a run planned before them is found again; set, they count."""
    from harness.identity import config_hashes, drop_paths

    plan = plan_of()
    config = plan.config
    new = ["model.min_pixels", "model.max_pixels", "budget.sft_warm_start_max_length"]
    assert config["model"]["min_pixels"] is None and config["budget"]["sft_warm_start_max_length"] is None
    before = drop_paths(config, new)  # the config as it was before the fields existed
    assert config_hashes(before, plan.identity["non_semantic_fields"]) == (
        plan.identity["config_sha256"], plan.identity["semantic_sha256"])
    assert plan_of("model.max_pixels=12544").identity["semantic_sha256"] != plan.identity["semantic_sha256"]
    assert plan_of("budget.sft_warm_start_max_length=512").identity["semantic_sha256"] != plan.identity["semantic_sha256"]


def test_the_warm_start_takes_its_max_length_from_the_child(plan_of):
    plan = plan_of("budget.sft_warm_start_max_length=512")
    assert plan.parent.config["arm"]["max_length"] == 512
    assert plan_of().parent.config["arm"]["max_length"] == 256  # conf/arm/sft.yaml's
    sft = plan_of("arm=sft")
    assert plan_of("arm=sft", "budget.sft_warm_start_max_length=512").run_name == sft.run_name  # SFT ignores it


# --- image tokens and prompt lengths are the processor's


def test_smart_resize_is_transformers_own(hub_snapshot):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as theirs

    from harness.models.pretrained import smart_resize

    for h in (28, 37, 56, 100, 333, 448, 500, 1200, 1500, 4000):
        for w in (28, 56, 64, 100, 448, 501, 1500):
            for lo, hi in ((3136, 12845056), (3136, 50176), (65536, 16777216), (200704, 200704)):
                for factor in (28, 32):
                    assert smart_resize(h, w, factor, lo, hi) == tuple(theirs(h, w, factor, lo, hi)), (h, w, lo, hi)


@pytest.mark.parametrize("family, pixels", [("qwen2_5_vl", {}), ("qwen2_5_vl", {"max_pixels": 12544}),
                                            ("qwen3_vl", {"min_pixels": 4096})])
def test_the_preflight_counts_what_the_processor_makes(hub_snapshot, tmp_path, family, pixels):
    import numpy as np
    from PIL import Image

    from harness.rewards.answers import prompt_text
    from harness.models.pretrained import load_processor
    from harness.run.stages.preflight import count_tokens

    proc = load_processor(hub_snapshot(family), **pixels)
    rows = []
    for i, (w, h) in enumerate(((56, 56), (448, 448), (100, 37), (333, 500))):
        name = f"{i}.png"
        Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype("uint8")).save(tmp_path / name)
        rows.append({"question": f"What color is shape {i}?", "answer_type": "word", "images": [{"path": name}]})
    counted = count_tokens(proc, tmp_path, rows, is_vlm=True)
    for row, (n, per_image) in zip(rows, counted):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt_text(row)}]}]
        text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out = proc(text=[text], images=[[Image.open(tmp_path / row["images"][0]["path"]).convert("RGB")]],
                   return_tensors="pt")
        assert n == out["input_ids"].shape[1]
        assert per_image == int(out["image_grid_thw"][0].prod()) // 4


# --- decoding and sampling do not take the checkpoint's generation_config


def test_greedy_eval_is_not_moved_by_the_checkpoints_generation_config(hub_snapshot):
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    from harness.eval.greedy import neutral_generation_kwargs
    from harness.models.pretrained import load_processor

    path = hub_snapshot()
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    proc = load_processor(path)
    text = proc.apply_chat_template([{"role": "user", "content": "Say something."}], add_generation_prompt=True,
                                    tokenize=False)
    inputs = proc(text=[text], return_tensors="pt")

    def greedy(**kw):
        with torch.no_grad():
            return model.generate(**inputs, max_new_tokens=24, do_sample=False, eos_token_id=[-1], pad_token_id=0,
                                  **kw)

    model.generation_config = GenerationConfig()
    clean = greedy()
    model.generation_config = GenerationConfig.from_pretrained(path)
    model.generation_config.repetition_penalty = 50.0  # the released 1.05, made visible on a random model
    assert not torch.equal(greedy(), clean)  # what the eval got before: the checkpoint's penalty
    assert torch.equal(greedy(**neutral_generation_kwargs(model)), clean)


def test_eos_ids_and_unused_rows_come_from_the_checkpoint(hub_snapshot):
    from transformers import AutoModelForImageTextToText

    from harness.models.pretrained import load_processor
    from harness.policy import eos_token_ids
    from harness.policy import rows_past_the_tokenizer

    path = hub_snapshot()
    model = AutoModelForImageTextToText.from_pretrained(path)
    proc = load_processor(path)
    tok = proc.tokenizer
    assert eos_token_ids(proc, model) == tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert eos_token_ids(proc) == tok.convert_tokens_to_ids(["<|im_end|>"])
    assert rows_past_the_tokenizer(model, proc) == list(range(len(tok), model.config.text_config.vocab_size))


# --- the preflight's decisions


def _preflight_plan(kind: str, **arm):
    from types import SimpleNamespace

    from harness import kinds

    config = {
        "arm": {"max_completion_length": 16, "max_length": 256, **arm}, "train": {"eval_max_new_tokens": 16},
        "model": {"min_pixels": None, "max_pixels": None, "is_vlm": True}, "output_root": "/nonexistent",
        "data": {"train_split": "train", "eval_split": "test", "eval_max_items": None}}
    return SimpleNamespace(kind=kinds.of(kind), config=config, cfg=_AttrView(config))


class _AttrView:
    """The fake plan's `cfg`: its config dict read by attribute, live (a test that edits plan.config sees it)."""

    def __init__(self, d: dict):
        self._d = d

    def __getattr__(self, name):
        v = self._d[name]
        return _AttrView(v) if isinstance(v, dict) else v


MEASURED = {"train": [100, 120, 110], "test": [90, 130], "train_keys": ["a", "b", "c"], "test_keys": ["d", "e"],
            "image_tokens": [4, 64], "sft_rows": [107, 300, 117]}


@pytest.mark.parametrize("kind, context, arm, field, longest", [
    ("rl", 130, {}, "arm.max_completion_length", "the longest is 120 tokens (record b"),  # 120 + 16 > 130
    ("rl", 1000, {"max_completion_length": 900}, "arm.max_completion_length", "2 of 3 training prompts"),
    ("sft", 140, {}, "train.eval_max_new_tokens", "the longest is 130 tokens (record e"),
    ("sft", 4096, {}, "arm.max_length", "1 of 3 SFT rows"),
])
def test_the_preflight_names_the_knob_the_count_and_the_longest_record(kind, context, arm, field, longest):
    from types import SimpleNamespace

    from harness.run.stages.preflight import check

    with pytest.raises(ConfigError) as exc:
        check(_preflight_plan(kind, **arm), SimpleNamespace(root=Path("/data")), MEASURED, context)
    (p,) = [p for p in exc.value.problems if p.field == field]
    assert longest in p.why and "/data" in p.why and p.fix
    if field == "arm.max_length":
        assert "budget.sft_warm_start_max_length=301" in p.fix


def test_the_preflight_passes_what_fits_and_says_what_it_measured():
    from types import SimpleNamespace

    from harness.run.stages.preflight import check, describe, summary

    plan = _preflight_plan("rl")
    fits = {k: v for k, v in MEASURED.items() if k != "sft_rows"}
    check(plan, SimpleNamespace(root=Path("/data")), fits, 4096)
    s = summary(plan, fits, 4096)
    assert s["train"] == {"n": 3, "min": 100, "median": 110, "max": 120} and s["image_tokens_per_image"] == [4, 64]
    assert describe(s, plan) == ("prompts: 3 train rows, 100/110/120 tokens (min/median/max); 4-64 image tokens per "
                                 "image; longest + arm.max_completion_length = 136 of the model's 4096 positions")


def test_the_preflight_measures_once_per_dataset_and_processor(hub_snapshot, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from harness.models.pretrained import load_processor
    from harness.run.stages import preflight

    calls = []
    monkeypatch.setattr(preflight, "_prompts", lambda plan, data, proc: calls.append(1) or {k: v for k, v in MEASURED.items() if k != "sft_rows"})
    plan = _preflight_plan("rl")
    plan.config["output_root"] = str(tmp_path)
    data = SimpleNamespace(root=tmp_path, content_sha256="d1")
    proc = load_processor(hub_snapshot())
    preflight.prompt_lengths(plan, data, proc, 4096)
    preflight.prompt_lengths(plan, data, proc, 4096)
    assert len(calls) == 1
    preflight.prompt_lengths(plan, SimpleNamespace(root=tmp_path, content_sha256="d2"), proc, 4096)  # other data
    preflight.prompt_lengths(plan, data, load_processor(hub_snapshot(), max_pixels=12544), 4096)
    assert len(calls) == 3


def test_a_pretrained_runs_policy_takes_the_checkpoints_own_processor_files(hub_snapshot, tmp_path):
    """A Trainer checkpoint of a run on a real checkpoint holds the processor as the image-only class saves it (no
    video processor: the stock AutoProcessor of a GPU node cannot rebuild it); load_policy takes the base
    checkpoint's files instead, whatever the policy dir holds."""
    from harness.policy import load_policy

    snap = hub_snapshot()
    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json",
                 "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        shutil.copy(snap / name, ckpt / name)
    (ckpt / "tokenizer_config.json").write_text("not json")  # what the dir holds is never read
    from harness.config.schema import ModelConfig
    from harness.config.typed import from_json

    model_cfg = from_json(ModelConfig, {"source": "pretrained", "dtype": "float32", "min_pixels": None,
                                        "max_pixels": 12544})
    _, proc = load_policy(ckpt, base_path=str(snap), trainable=False, model_cfg=model_cfg)
    assert type(proc).__name__ == "Qwen2_5_VLProcessor" and proc.image_processor.size["longest_edge"] == 12544


def test_the_preflights_memo_gives_what_a_fresh_measurement_gives(hub_snapshot, tmp_path, monkeypatch):
    """Cache on = cache off: the memoized lengths (JSON on disk) are the ones measured, and a hit measures nothing."""
    from types import SimpleNamespace

    import numpy as np
    from PIL import Image

    from harness.models.pretrained import load_processor
    from harness.run.stages import preflight

    rows = []
    for i, (w, h) in enumerate(((56, 56), (448, 448), (100, 37))):
        Image.fromarray((np.random.RandomState(i).rand(h, w, 3) * 255).astype("uint8")).save(tmp_path / f"{i}.png")
        rows.append({"question": f"Shape {i}?", "answer_type": "word", "target": "red", "images": [{"path": f"{i}.png"}],
                     "group_id": f"b{i}", "base_id": f"b{i}", "view_id": "full", "split": "train", "relation": "FULL"})
    data = SimpleNamespace(root=tmp_path, content_sha256="d1", train_rows=rows, test_rows=rows[:1])
    plan = _preflight_plan("sft", max_length=1024)
    plan.config["output_root"] = str(tmp_path / "out")
    proc = load_processor(hub_snapshot())
    fresh = preflight.prompt_lengths(plan, data, proc, 4096)
    monkeypatch.setattr(preflight, "_prompts", lambda *a: pytest.fail("measured again"))
    monkeypatch.setattr(preflight, "_sft_rows", lambda *a: pytest.fail("measured again"))
    assert preflight.prompt_lengths(plan, data, proc, 4096) == fresh
    assert fresh["image_tokens_per_image"] == [4, 256] and fresh["sft_rows"]["n"] == 3


def test_the_policy_build_checks_the_prompts_before_it_loads_the_weights(hub_snapshot, monkeypatch):
    """A prompt that does not fit is refused before a (large) model is loaded: the preflight gets the processor and
    the context from config.json, the weights come after."""
    from types import SimpleNamespace

    from harness import kinds
    from harness.config.schema import ModelConfig
    from harness.config.typed import from_json
    from harness import policy as policy_stage

    snap = str(hub_snapshot())
    model = {"source": "pretrained", "dtype": "float32", "min_pixels": None, "max_pixels": None}
    plan = SimpleNamespace(kind=kinds.of("sft"), config={"arm": {"init": "scratch"}, "model": model},
                           cfg=SimpleNamespace(model=from_json(ModelConfig, model)),
                           identity={"model": {"path": snap, "files_sha256": "x"}}, checkpoint_dir=snap)
    monkeypatch.setattr(policy_stage, "load_policy_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    seen = []

    def preflight(processor, context):
        seen.append((type(processor).__name__, context))
        raise ConfigError([])

    with pytest.raises(ConfigError):
        policy_stage.build_policy(plan, {}, [], "/run", preflight=preflight)
    assert seen == [("Qwen2_5_VLProcessor", 128000)]
