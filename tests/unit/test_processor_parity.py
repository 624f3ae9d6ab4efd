"""harness.models.parity: the image-only processor (harness.models.pretrained.image_only) gives exactly what the
stock Qwen-VL processor gives, key for key (input_ids, attention_mask, mm_token_type_ids, pixel_values,
image_grid_thw), for Qwen2-VL, Qwen2.5-VL and Qwen3-VL hub-layout fixtures, at the checkpoint's pixel bounds and at
a small max_pixels. The stock processor needs torchvision, which the project's venv lacks: those tests skip here
and run where it imports (a GPU node, or a side venv: see harness.models.parity). What runs everywhere: the
image-only processor equals the same output built by hand from its pieces (AutoTokenizer, AutoImageProcessor, each
<|image_pad|> expanded to grid.prod() // merge**2 copies), so its image-token counts and pixel_values are right
even where there is nothing stock to compare with; and the CLI says what to do without torchvision."""

from __future__ import annotations

import json

import pytest

from harness.models import parity, pretrained
from harness.models.pretrained import video_backend

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
PIXELS = (None, 50176)  # the checkpoint's own bounds; 224*224, which the 1500x1200 and 448x448 images exceed
KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw")
needs_torchvision = pytest.mark.skipif(
    not video_backend(), reason="torchvision does not import here, so transformers cannot build the stock Qwen-VL "
                                "processor to compare with; run this module where it does (a GPU node, or a venv "
                                "with torch==2.14.1 torchvision==0.29.1)")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from harness.models.snapshot import build_snapshot

    root = tmp_path_factory.mktemp("parity")
    return {fam: str(build_snapshot(root / fam, family=fam)) for fam in FAMILIES}


@needs_torchvision
@pytest.mark.parametrize("max_pixels", PIXELS)
@pytest.mark.parametrize("family", FAMILIES)
def test_image_only_equals_stock(checkpoints, family, max_pixels):
    r = parity.compare(checkpoints[family], max_pixels=max_pixels)
    decisive = r["like_for_like"] or r["calls"]  # like for like where the two sides' image backends differ
    for call, found in decisive.items():
        assert not r["calls"][call]["only_stock"] and not r["calls"][call]["only_image_only"], (call, r["calls"])
        for key in KEYS if call == "images" else ("input_ids", "attention_mask", "mm_token_type_ids"):
            if key == "mm_token_type_ids" and key not in found["keys"]:
                continue
            assert found["keys"][key]["equal"], (family, max_pixels, call, key, found["keys"][key], r["backends"])
    assert r["ok"]
    assert r["classes"]["image_only"].startswith("harness.models.pretrained.")
    assert r["classes"]["stock"].rsplit(".", 1)[1] == r["classes"]["image_only"].rsplit(".", 1)[1]
    if max_pixels:  # honoured: every image over it is shrunk to at most max_pixels (smaller ones may grow past it)
        patch = pretrained.read_checkpoint(checkpoints[family])[0].patch_size
        assert all(h * w * patch**2 <= max_pixels for (_, h, w), size in zip(r["grids"], parity.SIZES)
                   if size[0] * size[1] > max_pixels), r["grids"]
    # PIL vs torchvision (CPU machine vs GPU node): the integer outputs agree; pixels within a few uint8 levels
    pvt = r["pil_vs_torchvision"]
    assert {"input_ids", "attention_mask", "image_grid_thw"} <= set(pvt["equal_keys"]), pvt
    std = 0.5 if family == "qwen3_vl" else 0.2613
    assert pvt["pixel_values_max_abs_diff"] <= 4 / 255 / std, pvt


@needs_torchvision
def test_cli_prints_one_line_per_checkpoint(checkpoints, capsys):
    assert parity.main([*checkpoints.values(), "--max-pixels", "50176"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(" EQUAL " in ln for ln in lines), lines
    assert parity.main([checkpoints["qwen3_vl"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


@pytest.mark.parametrize("max_pixels", PIXELS)
@pytest.mark.parametrize("family", FAMILIES)
def test_image_only_equals_its_pieces_by_hand(checkpoints, family, max_pixels):
    """No torchvision needed: the image-only processor's batch is the tokenizer's and the image processor's."""
    import torch
    from transformers import AutoImageProcessor, AutoTokenizer

    path = checkpoints[family]
    proc = pretrained.load_processor(path, max_pixels=max_pixels, stock=False)
    assert getattr(proc, "harness_image_only", False) and getattr(proc, "video_processor", None) is None
    if not video_backend():
        assert parity.backend(proc.image_processor) == "pil"
    imgs = parity.images()
    messages = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
                for q in parity.QUESTIONS]
    got = proc(text=[proc.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages],
               images=[[im] for im in imgs], padding=True, return_tensors="pt")

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    ip = AutoImageProcessor.from_pretrained(path, **pretrained.pixel_kwargs(None, max_pixels))
    with open(f"{path}/chat_template.json", encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    vision = ip(images=imgs, return_tensors="pt")
    info, _ = pretrained.read_checkpoint(path)
    texts = []
    for m, grid, im in zip(messages, vision["image_grid_thw"], imgs):
        text = tok.apply_chat_template(m, chat_template=template, add_generation_prompt=True, tokenize=False)
        assert text.count("<|image_pad|>") == 1, text
        n = int(grid.prod()) // ip.merge_size**2
        # the harness's own torch-free count (it sizes prompts at plan time) agrees with the image processor's
        assert n == pretrained.image_tokens(im.height, im.width, patch_size=info.patch_size, merge_size=ip.merge_size,
                                            min_pixels=info.min_pixels, max_pixels=max_pixels or info.max_pixels)
        texts.append(text.replace("<|image_pad|>", "<|image_pad|>" * n))
    want = tok(texts, padding=True, return_tensors="pt")
    pad_id = tok.convert_tokens_to_ids("<|image_pad|>")
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(got[key], want[key]), key
    assert torch.equal(got["mm_token_type_ids"], (want["input_ids"] == pad_id).long())
    assert torch.equal(got["pixel_values"], vision["pixel_values"])
    assert torch.equal(got["image_grid_thw"], vision["image_grid_thw"])
    assert int((got["input_ids"] == pad_id).sum()) == sum(int(g.prod()) // ip.merge_size**2
                                                           for g in vision["image_grid_thw"])


def test_without_torchvision_the_cli_says_where_to_run(checkpoints, monkeypatch, capsys):
    monkeypatch.setattr(pretrained, "video_backend", lambda: False)
    assert parity.main([checkpoints["qwen2_vl"]]) == 2
    assert "torchvision does not import here" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="torchvision==0.29.1"):
        parity.compare(checkpoints["qwen2_vl"])
