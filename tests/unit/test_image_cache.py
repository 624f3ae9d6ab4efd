"""The image cache (harness.models.imagecache) gives exactly the tensors the image processor gives, never
preprocesses the same pixels twice while they fit, stays within its size, and is invisible to saving."""

from __future__ import annotations

import copy
import pickle
import random

import numpy as np
import pytest
import torch
from PIL import Image

from harness.models import imagecache
from harness.models.processor import image_processor_for


def _image(side: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def _equal(a, b) -> bool:
    if set(a.keys()) != set(b.keys()):
        return False
    return all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) and type(a[k]) is type(b[k]) for k in a)


@pytest.mark.parametrize("family,patch", [("qwen2_vl", 14), ("qwen3_vl", 16)])
@pytest.mark.parametrize("return_tensors", ["pt", None])
def test_same_tensors_as_the_image_processor_in_any_order_and_nesting(family, patch, return_tensors):
    plain = image_processor_for(family, patch)
    cached = imagecache.CachedImageProcessor(image_processor_for(family, patch), 64 << 20)
    pool = [_image(4 * patch, s) for s in range(5)] + [_image(9 * patch, 9)]  # two sizes: two grids
    rng = random.Random(0)
    kw = {"return_tensors": return_tensors} if return_tensors else {}
    for _ in range(6):
        flat = [rng.choice(pool) for _ in range(rng.randrange(1, 9))]
        for images in (flat, [[x] for x in flat]):  # TRL passes one list per prompt
            assert _equal(plain(images=images, **kw), cached(images=images, **kw))
    s = cached.stats()
    assert s["misses"] == len(pool) and s["hits"] > 0 and s["bypassed"] == 0


def test_call_arguments_are_part_of_the_key():
    plain = image_processor_for("qwen2_vl", 14)
    cached = imagecache.CachedImageProcessor(image_processor_for("qwen2_vl", 14), 64 << 20)
    images = [_image(56, 0), _image(112, 1)]
    for kw in ({"return_tensors": "pt"}, {}, {"return_tensors": "pt", "max_pixels": 56 * 56}):
        assert _equal(plain(images=images, **kw), cached(images=images, **kw)), kw
    assert cached.stats()["misses"] == 6


def test_the_g_copies_of_a_prompt_are_preprocessed_once():
    cached = imagecache.CachedImageProcessor(image_processor_for("qwen2_vl", 14), 64 << 20)
    calls = []
    real = cached.inner.preprocess
    cached.inner.preprocess = lambda images, **kw: calls.append(len(images)) or real(images, **kw)
    prompts = [_image(56, s) for s in range(4)]
    batch = [[p] for p in prompts for _ in range(8)]  # 4 prompts x 8 completions
    cached(images=batch, return_tensors="pt")
    cached(images=batch, return_tensors="pt")  # TRL's second call for the same batch
    assert calls == [4]
    assert cached.stats()["hits"] == 64 - 4


def test_a_redecoded_copy_hits_and_a_changed_image_misses(tmp_path):
    cached = imagecache.CachedImageProcessor(image_processor_for("qwen2_vl", 14), 64 << 20)
    img = _image(56, 1)
    img.save(tmp_path / "a.png")
    cached(images=[Image.open(tmp_path / "a.png")], return_tensors="pt")
    cached(images=[Image.open(tmp_path / "a.png")], return_tensors="pt")
    assert (cached.stats()["hits"], cached.stats()["misses"]) == (1, 1)
    changed = img.copy()
    changed.putpixel((0, 0), tuple(255 - v for v in img.getpixel((0, 0))))
    out = cached(images=[changed], return_tensors="pt")
    assert cached.stats()["misses"] == 2
    assert torch.equal(out["pixel_values"], image_processor_for("qwen2_vl", 14)(images=[changed], return_tensors="pt")["pixel_values"])


def test_the_lru_stays_within_its_size_and_a_call_larger_than_it_still_answers():
    one = image_processor_for("qwen2_vl", 14)(images=[_image(56, 0)], return_tensors="pt")["pixel_values"]
    per_image = one.nbytes + 3 * 8
    cached = imagecache.CachedImageProcessor(image_processor_for("qwen2_vl", 14), 3 * per_image)
    images = [_image(56, s) for s in range(7)]
    out = cached(images=images, return_tensors="pt")  # 7 images through a 3-image cache
    assert _equal(out, image_processor_for("qwen2_vl", 14)(images=images, return_tensors="pt"))
    assert cached.stats()["images"] == 3 and cached.bytes <= cached.max_bytes
    cached(images=images[-1:], return_tensors="pt")  # the most recent ones stayed
    assert cached.stats()["hits"] == 1


def test_inputs_it_cannot_split_go_to_the_image_processor_untouched():
    plain = image_processor_for("qwen2_vl", 14)
    cached = imagecache.CachedImageProcessor(image_processor_for("qwen2_vl", 14), 64 << 20)
    arr = np.asarray(_image(56, 3))
    assert _equal(plain(images=[arr], return_tensors="pt"), cached(images=[arr], return_tensors="pt"))
    assert cached.stats()["bypassed"] == 1 and cached.stats()["images"] == 0


def test_install_and_what_saving_copying_and_pickling_see():
    class Proc:  # a processor is anything with an image_processor attribute
        image_processor = image_processor_for("qwen2_vl", 14)

    p = imagecache.install(Proc(), 8)
    ip = p.image_processor
    assert isinstance(ip, imagecache.CachedImageProcessor) and ip.max_bytes == 8 << 20
    assert imagecache.install(p, 16).image_processor.inner is ip.inner  # never a cache of a cache
    assert ip.patch_size == 14 and ip.to_json_string() == ip.inner.to_json_string()
    assert type(copy.deepcopy(ip)) is type(ip.inner)  # ProcessorMixin.to_dict deep-copies its attributes
    back = pickle.loads(pickle.dumps(ip))
    assert isinstance(back, imagecache.CachedImageProcessor) and back.stats()["images"] == 0
    ip.merge_size = 2  # attribute writes reach the real image processor
    assert "merge_size" not in ip.__dict__
    tokenizer_only = object()
    assert imagecache.install(tokenizer_only, 8) is tokenizer_only
    assert imagecache.stats(tokenizer_only) is None


def test_a_saved_tiny_processor_is_byte_identical_with_the_cache(tmp_path):
    from harness.models import build_tiny
    from harness.policy import load_policy

    path = build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny={"hidden_size": 32, "num_layers": 1,
                      "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "intermediate_size": 32,
                      "vision_width": 16, "vision_depth": 1, "vocab_size": 300, "init_seed": 0},
                      corpus=["What color is it? <answer>red</answer>"], cache_dir=tmp_path / "models")
    _, plain = load_policy(path)
    _, cached = load_policy(path)
    imagecache.install(cached, 8)
    cached(text=["<|vision_start|><|image_pad|><|vision_end|>q"], images=[_image(56, 0)], return_tensors="pt")
    plain.save_pretrained(tmp_path / "plain")
    cached.save_pretrained(tmp_path / "cached")
    files = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "cached").iterdir())
    for name in files:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "cached" / name).read_bytes(), name
