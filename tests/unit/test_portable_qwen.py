"""A real checkpoint's final policy (issue 46): its processor loads the plain way without torchvision, and its card and
adapter name the base that was trained. On hub-layout fixtures (harness.models.snapshot) and composed plans, in
process; the run that writes such a folder and the load in a process without the harness are in
tests/integration/test_qwen_checkpoint.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.config.schema import ModelConfig, TrainConfig
from harness.config.typed import from_json
from harness.portable import IMAGE_ONLY, PROCESSOR_CODE, PROCESSOR_SOURCE, STOCK_PROCESSOR, make_portable

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
NO_PUSH = {"push_to_hub": False, "hub_model_id": None}


def _model(d: dict) -> ModelConfig:
    """A model config as a run manifest's dict reads back: through the typed schema (the rest: its defaults)."""
    return from_json(ModelConfig, d)


def _train(d: dict) -> TrainConfig:
    return from_json(TrainConfig, d)


def _policy_folder(tmp: Path, snap: Path) -> Path:
    """What the Trainer leaves for a LoRA run before make_portable: the adapter and the image-only processor's own
    form (processor_config.json without a video processor), which make_portable replaces by the checkpoint's."""
    fp = tmp / "final_policy"
    fp.mkdir(parents=True)
    (fp / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(snap), "r": 16}))
    saved = {"processor_class": "Qwen2VLProcessor", "image_processor": {}}
    (fp / "processor_config.json").write_text(json.dumps(saved))
    return fp


@pytest.mark.parametrize("family", FAMILIES)
def test_a_qwen_vl_policy_ships_the_image_only_form_of_its_processor(hub_snapshot, tmp_path, family):
    """processor_config.json names the stock class (AutoProcessor without trust_remote_code builds it where
    torchvision imports) and, in auto_map, its image-only form; that class gives the harness's image-only processor's
    outputs (held equal to the stock one's by tests/unit/test_processor_parity.py), and load_policy loads the folder
    with the class it always did."""
    import torch

    from harness.models import parity, processor
    from harness.models.pretrained import load_processor, processor_class_of, video_backend
    from harness.policy import load_policy_processor

    snap = hub_snapshot(family)
    fp = _policy_folder(tmp_path, snap)
    model = {"source": "pretrained", "is_vlm": True, "hub_id": "Qwen/Qwen2.5-VL-3B-Instruct", "path": str(snap)}
    got = make_portable(fp, model_cfg=_model(model), train_cfg=_train(NO_PUSH), base_path=str(snap))
    stock = STOCK_PROCESSOR[family]
    assert got["processor_code"] == PROCESSOR_CODE
    assert (fp / PROCESSOR_CODE).read_bytes() == PROCESSOR_SOURCE.read_bytes()
    assert json.loads((fp / "processor_config.json").read_text()) == {
        "processor_class": stock, "auto_map": {"AutoProcessor": f"processing_harness_vl.{IMAGE_ONLY[stock]}"}}
    for name in ("preprocessor_config.json", "tokenizer_config.json", "chat_template.json"):  # the checkpoint's own
        assert (fp / name).read_bytes() == (snap / name).read_bytes(), name
    assert processor_class_of(fp) == stock

    shipped = getattr(processor, IMAGE_ONLY[stock]).from_pretrained(str(fp))
    assert shipped.get_attributes() == ["image_processor", "tokenizer"] and shipped.chat_template
    shipped.tokenizer.padding_side = "left"  # as the harness pads (load_processor)
    harness_side = load_processor(snap, stock=False)
    imgs = parity.images()[:4]
    want, _, _ = parity.run(harness_side, imgs)
    have, _, _ = parity.run(shipped, imgs)
    assert set(have) == set(want) >= {"input_ids", "pixel_values", "image_grid_thw"}
    assert all(torch.equal(have[k], want[k]) for k in want), [k for k in want if not torch.equal(have[k], want[k])]
    if video_backend():  # a GPU node: the plain AutoProcessor is the stock class, with the same outputs
        from transformers import AutoProcessor

        plain = AutoProcessor.from_pretrained(str(fp))
        assert type(plain).__name__ == stock and type(plain).__module__.startswith("transformers.")
        plain.tokenizer.padding_side = "left"
        ref, _, _ = parity.run(plain, imgs)
        assert all(torch.equal(have[k], ref[k]) for k in ref)
    with pytest.raises(ValueError, match="image-only"):
        shipped(text=["x"], videos=[[imgs[0]]])

    # the harness's own load, as before: harness.models.pretrained's image-only class (the stock one with torchvision)
    loaded = load_policy_processor(fp, base_path=str(snap))
    module = "transformers." if video_backend() else "harness.models.pretrained"
    assert type(loaded).__name__ == stock and type(loaded).__module__.startswith(module)
    mine, _, _ = parity.run(loaded, imgs)
    assert all(torch.equal(mine[k], want[k]) for k in want)


def test_the_image_only_names_are_the_shipped_modules_classes():
    """harness.portable spells them out (it is torch-free); each is the stock class of that name minus its video
    processor."""
    import inspect

    import transformers

    from harness.models import processor

    assert set(IMAGE_ONLY) == set(STOCK_PROCESSOR.values())
    for stock, name in IMAGE_ONLY.items():
        cls = getattr(processor, name)
        assert issubclass(cls, getattr(transformers, stock))
        assert cls.get_attributes() == ["image_processor", "tokenizer"]
        assert "video_processor" not in inspect.signature(cls.__init__).parameters


def test_a_text_only_checkpoint_ships_no_processor_code(tmp_path):
    base = tmp_path / "qwen2"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (base / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32768}))
    fp = tmp_path / "final_policy"
    fp.mkdir()
    got = make_portable(fp, model_cfg=_model({"source": "pretrained", "is_vlm": False, "hub_id": None, "path": str(base)}),
                        train_cfg=_train(NO_PUSH), base_path=str(base))
    assert got["processor_code"] is None and got["processor_files"] == ["tokenizer_config.json"]
    assert not (fp / PROCESSOR_CODE).exists() and not (fp / "processor_config.json").exists()


def test_a_checkpoints_own_processor_config_keeps_its_content(hub_snapshot, tmp_path):
    snap = shutil.copytree(hub_snapshot(), tmp_path / "ckpt")
    (snap / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor", "x": 1}))
    fp = _policy_folder(tmp_path, snap)
    make_portable(fp, model_cfg=_model({"source": "pretrained", "is_vlm": True, "hub_id": None, "path": str(snap)}),
                  train_cfg=_train(NO_PUSH), base_path=str(snap))
    assert json.loads((fp / "processor_config.json").read_text()) == {
        "processor_class": "Qwen2_5_VLProcessor", "x": 1,
        "auto_map": {"AutoProcessor": "processing_harness_vl.Qwen2_5_VLImageOnlyProcessor"}}


# --- the base the card and the adapter name (issue 46 item 4)

HUB_ID = "Org/Tiny-VL"  # not the option's default, so a card naming it says where it came from


def _card(plan, tmp: Path, *, lora: bool = True) -> str:
    from harness.card import render_card

    run = tmp / "run"
    run.mkdir(exist_ok=True)
    comp = {"optimizer_steps": 2, "stopped_by": "budget", "nonfinite_steps": 0, "completion_token_ceiling": 100,
            "realized_completion_tokens": 90, "realized_completion_count": 9}
    policy = {"tuning": "lora" if lora else "full", "weights_sha256": "w" * 64,
              "portable": {"processor_code": PROCESSOR_CODE}}
    return render_card(plan, run, plan.identity, comp, policy)


def _front(card: str) -> str:
    return card.split("---")[1]


def test_a_model_path_runs_card_and_adapter_name_the_path_not_the_hub_id(plan_of, hub_snapshot, tmp_path):
    snap = hub_snapshot()
    plan = plan_of("model=qwen", f"model.path={snap}", "model.dtype=float32")
    default = plan.cfg.model.hub_id  # the option's Qwen/Qwen2.5-VL-3B-Instruct: not what was trained
    assert default
    card = _card(plan, tmp_path)
    assert default not in card and "base_model" not in _front(card)  # a local path is no hub repo id
    assert f"| model | `{snap.name}`, the local checkpoint `{snap}` (model.path)" in card
    assert "AutoProcessor.from_pretrained(path, trust_remote_code=True)" in card
    fp = _policy_folder(tmp_path, Path("/cache/elsewhere"))
    got = make_portable(fp, model_cfg=plan.cfg.model, train_cfg=_train(NO_PUSH), base_path=plan.checkpoint_dir)
    assert json.loads((fp / "adapter_config.json").read_text())["base_model_name_or_path"] == str(snap)
    assert got["adapter_base"]["base_model_name_or_path"] == str(snap) and not got["adapter_base"]["portable"]


def test_a_hub_id_runs_card_and_adapter_name_the_hub_model(plan_of, hub_snapshot, tmp_path, monkeypatch):
    cache = tmp_path / "hf"
    repo = cache / ("models--" + HUB_ID.replace("/", "--"))
    shutil.copytree(hub_snapshot(), repo / "snapshots" / "rev0")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev0")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    plan = plan_of("model=qwen", f"model.hub_id={HUB_ID}", "model.dtype=float32")
    assert plan.identity["model"]["hub_id"] == HUB_ID
    card = _card(plan, tmp_path)
    assert f"base_model: {HUB_ID}\n" in _front(card)
    assert f"| model | `{HUB_ID}`, from the Hugging Face cache (model.hub_id, revision `rev0`)" in card
    fp = _policy_folder(tmp_path, Path("/cache/elsewhere"))
    got = make_portable(fp, model_cfg=plan.cfg.model, train_cfg=_train(NO_PUSH), base_path=plan.checkpoint_dir)
    assert json.loads((fp / "adapter_config.json").read_text())["base_model_name_or_path"] == HUB_ID
    assert got["adapter_base"]["portable"]
