"""harness.models.fastvision: model.dedupe_rows gives the stock processor output and model.rope_cache the stock
M-RoPE index, bit for bit; model.share_vision_features (off by default) gives every copy of an image the features
the stock vision tower gives it (bit for bit on these batches), and with autograd the stock path runs; the cached
M-RoPE index is the stock index, integer for integer, on padded rows,
rows with several images and text-only rows; deep copies keep the shortcuts; other models are left alone."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from harness.models import fastvision
from harness.models import tiny as tiny_mod
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

TINY = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128,
            vision_width=64, vision_depth=2, vocab_size=512, init_seed=0)  # fmt: skip
CORPUS = [f"What color is the {s}? <answer>{c}</answer>" for s in ("circle", "square", "star")
          for c in ("red", "green", "blue")]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("fastvision")
    return {fam: tiny_mod.build_tiny(family=fam, is_vlm=fam != "qwen2", patch_size=16 if fam == "qwen3_vl" else 14,
                                     tiny=TINY, corpus=CORPUS, cache_dir=root)
            for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2")}


def _image(side: int, seed: int):
    from PIL import Image

    rng = random.Random(seed)
    img = Image.new("RGB", (side, side))
    img.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(side * side)])
    return img


def _pixels(processor, images):
    out = processor.image_processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _base(model):
    return next(m for m in model.modules() if isinstance(m, tuple(fastvision._FAST)))


def test_distinct_images_merges_only_equal_pixels():
    a, b = torch.arange(8.0).view(2, 4), torch.arange(8.0).view(2, 4).flip(0)  # same sum, other pixels
    c = torch.ones(4, 4)
    grid = torch.tensor([[1, 1, 2], [1, 1, 2], [1, 2, 2], [1, 1, 2], [1, 1, 2]])
    firsts, inverse = fastvision.distinct_images(torch.cat([a, b, c, a, b]), grid)
    assert firsts == [0, 1, 2] and inverse == [0, 1, 2, 0, 1]
    # the same pixels under another grid are another image
    firsts, inverse = fastvision.distinct_images(torch.cat([a, a]), torch.tensor([[1, 1, 2], [1, 2, 1]]))
    assert firsts == [0, 1] and inverse == [0, 1]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_every_copy_gets_the_stock_features_and_the_loss_path_is_the_stock_one(built, family):
    model, processor = tiny_mod.load_tiny(built[family])
    images = [_image(56, 0), _image(112, 1), _image(56, 0), _image(56, 2), _image(112, 1), _image(56, 0)]
    pv, grid = _pixels(processor, images)
    base = _base(model)
    weight = torch.randn(sum(int(g.prod()) // 4 for g in grid), model.config.text_config.hidden_size,
                         generator=torch.Generator().manual_seed(0))
    calls = []
    visual_forward = base.visual.forward
    base.visual.forward = lambda pixel_values, **kw: calls.append(len(kw["grid_thw"])) or visual_forward(pixel_values, **kw)

    def run(dedupe: bool, grad: bool):
        fastvision.install(model, share_vision_features=dedupe, rope_cache=False)
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            out = base.get_image_features(pv, grid, return_dict=True)
        if grad:
            (torch.cat(out.pooler_output) * weight).sum().backward()
        grads = {n: p.grad.clone() for n, p in base.visual.named_parameters() if p.grad is not None}
        return [t.detach() for t in out.pooler_output], out.last_hidden_state.detach(), grads

    stock, stock_hidden, _ = run(False, grad=False)
    fast, fast_hidden, _ = run(True, grad=False)
    assert calls == [6, 3], calls  # the tower saw the 3 distinct images once
    assert len(fast) == len(images)
    assert all(torch.equal(x, y) for x, y in zip(stock, fast)), "a copy got other features"
    assert torch.equal(stock_hidden, fast_hidden)
    # with autograd (the loss forward) every copy goes through the tower, so the gradient is the stock one bit for bit
    _, _, stock_grads = run(False, grad=True)
    _, _, fast_grads = run(True, grad=True)
    assert calls[2:] == [6, 6], calls
    assert stock_grads.keys() == fast_grads.keys() and stock_grads
    assert all(torch.equal(fast_grads[n], g) for n, g in stock_grads.items())


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_a_forward_with_repeated_prompts_gives_the_stock_logits(built, family):
    model, processor = tiny_mod.load_tiny(built[family])
    model.eval()
    convs, images = [], []
    for i, (side, seed) in enumerate([(56, 0), (112, 1), (56, 0), (56, 0), (112, 1)]):
        convs.append([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What color " * (i + 1)}]}])
        images.append([_image(side, seed)])
    text = [processor.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in convs]
    inputs = processor(text=text, images=images, padding=True, padding_side="left", return_tensors="pt")
    logits = {}
    for on in (False, True, True):  # the second `on` answers the rope index from the cache
        fastvision.install(model, share_vision_features=on, rope_cache=on)
        with torch.no_grad():
            logits.setdefault(on, []).append(model(**inputs).logits)
    assert torch.equal(logits[False][0], logits[True][0]) and torch.equal(logits[True][0], logits[True][1])


def _rope_batch(rng: random.Random, n_rows: int, merge: int = 2):
    """input_ids / mm_token_type_ids / attention_mask / image_grid_thw of rows with 0-2 images and padding on either side."""
    rows, grids = [], []
    for _ in range(n_rows):
        types = [0] * rng.randrange(1, 6)
        for _ in range(rng.choice([0, 1, 1, 2])):
            g = [1, rng.choice([2, 4, 6]), rng.choice([2, 4])]
            grids.append(g)
            types += [1] * (g[0] * g[1] * g[2] // merge**2) + [0] * rng.randrange(1, 4)
        rows.append(types)
    width = max(map(len, rows)) + 3
    ids, tt, mask = [], [], []
    for types in rows:
        pad = width - len(types)
        left = rng.randrange(pad + 1)
        ids.append([0] * left + [7 if t else 5 for t in types] + [0] * (pad - left))
        tt.append([0] * left + types + [0] * (pad - left))
        mask.append([0] * left + [1] * len(types) + [0] * (pad - left))
    grid = torch.tensor(grids) if grids else None
    return torch.tensor(ids), torch.tensor(tt), torch.tensor(mask), grid


def test_the_cached_rope_index_is_the_stock_one(built):
    model, _ = tiny_mod.load_tiny(built["qwen2_vl"])
    base = _base(model)
    fastvision.install(model, share_vision_features=False, rope_cache=True)
    rng = random.Random(0)
    batches = [_rope_batch(rng, rng.randrange(1, 7)) for _ in range(30)]
    for ids, tt, mask, grid in batches + batches:  # the second pass answers from the cache
        for m in (mask, None):
            want = Qwen2VLModel.get_rope_index(base, ids, tt, image_grid_thw=grid, attention_mask=m)
            got = base.get_rope_index(ids, tt, image_grid_thw=grid, attention_mask=m)
            assert torch.equal(got[0], want[0]) and got[0].dtype == want[0].dtype
            assert torch.equal(got[1], want[1]) and got[1].dtype == want[1].dtype
    assert len(base.__dict__["_harness_rope_rows"]) > 0


def test_install_survives_deepcopy_and_leaves_other_models_alone(built):
    model, _ = tiny_mod.load_tiny(built["qwen2_vl"])
    keys = list(model.state_dict())
    assert fastvision.install(model, share_vision_features=True, rope_cache=False) == 1
    twin = copy.deepcopy(model)
    assert type(_base(twin)) is fastvision.FastQwen2VLModel
    assert _base(twin).__dict__[fastvision._FLAGS] == {"share_vision_features": True, "rope_cache": False}
    assert list(model.state_dict()) == keys and model.config.architectures == twin.config.architectures
    for family in ("qwen3_vl", "qwen2"):
        other, _ = tiny_mod.load_tiny(built[family])
        classes = [type(m) for m in other.modules()]
        assert fastvision.install(other, share_vision_features=True, rope_cache=True) == 0
        assert [type(m) for m in other.modules()] == classes


def test_the_row_dedupe_is_never_saved(built, tmp_path):
    _, processor = tiny_mod.load_tiny(built["qwen2_vl"])
    processor.save_pretrained(tmp_path / "off")
    assert fastvision.dedupe_rows(processor, True)
    processor.save_pretrained(tmp_path / "on")
    for f in (tmp_path / "off").iterdir():
        assert f.read_bytes() == (tmp_path / "on" / f.name).read_bytes(), f.name


@pytest.mark.parametrize("return_tensors", ["pt", None])
def test_the_row_dedupe_of_the_processor_gives_the_stock_output(built, return_tensors):
    """TRL's two processor calls of a GRPO step (the prompt tokenization without tensors, the scoring inputs with
    padding and tensors) on rows that repeat, with rows of two images and of another image size among them."""
    _, processor = tiny_mod.load_tiny(built["qwen2_vl"])
    conv = lambda n, words: [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": words}]}]  # noqa: E731
    rows = [(conv(1, "What color"), [_image(56, 0)]), (conv(1, "What color is it"), [_image(112, 1)]),
            (conv(2, "Which"), [_image(56, 0), _image(56, 2)])]
    order = [0, 0, 1, 2, 0, 1, 2, 2, 1, 0]
    text = [processor.apply_chat_template(rows[i][0], add_generation_prompt=True, tokenize=False) for i in order]
    images = [[im.copy() for im in rows[i][1]] for i in order]  # equal pixels, other objects (as TRL decodes them)
    kwargs = {"padding": True, "return_tensors": "pt"} if return_tensors else {}
    outs = {}
    for on in (False, True):
        assert fastvision.dedupe_rows(processor, on) is on
        outs[on] = processor(images=images, text=text, **kwargs)
    assert fastvision.distinct_rows(images, text, kwargs) is not None  # the dedupe path ran
    assert outs[False].keys() == outs[True].keys()
    for k, want in outs[False].items():
        got = outs[True][k]
        if isinstance(want, torch.Tensor):
            assert torch.equal(got, want) and got.dtype == want.dtype, k
        elif hasattr(want, "shape"):
            assert (got == want).all() and got.dtype == want.dtype and got.shape == want.shape, k
        else:
            assert got == want, k
