"""Shortcuts for the copies TRL makes: it repeats each prompt and its image G times in the batch, and
transformers then processes, encodes and positions every copy. Measured on the tiny VLM (2 cores, one GRPO step
~0.36 s): the two processor calls 31 ms, the vision tower 11 ms per no-grad forward on 32 images (2.8 ms on the 4
distinct ones), `get_rope_index` ~10 ms per call (a Python loop per row), two calls a step (bench/RESULTS.md).

- `model.dedupe_rows` (on): the tiny models' processor (HarnessVLProcessor) handles each distinct (text, image
  pixels) row of a call once and gathers the rows back. Tokenizing and preprocessing are per row and per image, and
  the padded width is the same maximum: the same tensors, bit for bit.
- `model.rope_cache` (on): `get_rope_index` answers each row from a small LRU keyed by the row's token types (after
  the attention mask) and the grids of its images; a miss computes the row with transformers' own algorithm.
  Integer positions: the same tensors, bit for bit.
- `model.share_vision_features` (off): without autograd (generation's prefill, evals, no-grad re-scoring)
  `get_image_features` finds identical images (same grid, same pixel rows: torch.equal), runs the vision tower on
  the distinct ones and hands every copy its features. The features are the stock ones up to float rounding only:
  the tower encodes each image on its own, but a CPU matmul's result for a row can depend on how many rows the
  batch has. Measured: bit for bit in the unit test and over the default job's 397 GRPO steps, but evi_po's loss
  moved by 2e-7 within two steps, and a run that differs by rounding can end elsewhere (a variant that also shared
  the features in the loss forward ended the default job at 0.743 held-out accuracy instead of 0.968). So it is off,
  and never used with autograd.

With the two defaults a run's samples, losses and weights are the same, bit for bit, as without them
(tests/integration/test_invariance.py, tests/unit/test_fastvision.py).

Installed on a loaded model by `install(model, share_vision_features=..., rope_cache=...)`, which swaps the class of
the inner Qwen2VLModel / Qwen2_5_VLModel (PEFT-wrapped or not) for a subclass defined here: deep copies (a reference
model) and pickles keep it, the weights and the saved files do not change (save_pretrained writes the outer
model's config and state dict). Other model classes are left as they are. Anything outside the plain path
(videos, extra kwargs, hidden states or attentions asked for) goes to transformers' code untouched. The row dedupe
is an instance attribute of the processor (`dedupe_rows`), never saved.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict

import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

ROPE_CACHE_ROWS = 4096  # row layouts kept (a (3, L) int64 tensor each: ~1 KB for the tiny job's rows)
_FLAGS = "_harness_fastvision"  # instance attribute: {"share_vision_features": bool, "rope_cache": bool}


def distinct_images(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[list[int], list[int]]:
    """(first index of each distinct image, for each image the position of its distinct one in that list).

    Images are the pixel-row blocks of `pixel_values` (grid t*h*w rows each); two are the same when their grids
    and all their pixel rows are equal (torch.equal), never by a hash alone."""
    sizes = grid_thw.prod(-1).tolist()
    blocks = torch.split(pixel_values, sizes)
    grids = [tuple(g) for g in grid_thw.tolist()]
    sums = torch.stack([b.sum() for b in blocks]).tolist() if blocks else []
    firsts: list[int] = []
    inverse: list[int] = []
    by_key: dict[tuple, list[int]] = {}  # (grid, pixel sum) -> positions in `firsts`
    for i, block in enumerate(blocks):
        key = (grids[i], sums[i])
        for pos in by_key.get(key, ()):
            if torch.equal(blocks[firsts[pos]], block):
                inverse.append(pos)
                break
        else:
            by_key.setdefault(key, []).append(len(firsts))
            inverse.append(len(firsts))
            firsts.append(i)
    return firsts, inverse


class _FastVision:
    """The two shortcuts, mixed in before the stock model class (see `install`)."""

    def get_image_features(self, pixel_values, image_grid_thw=None, **kwargs):
        flags = self.__dict__.get(_FLAGS, {})
        extra = set(kwargs) - {"return_dict"}
        # Only without autograd: with it, the copies' gradients would be summed before the tower's backward, in
        # another float order than the stock path (measured: the default job ended at 0.743, not 0.968).
        if (not flags.get("share_vision_features") or torch.is_grad_enabled() or image_grid_thw is None or extra
                or kwargs.get("return_dict", True) is not True or pixel_values.shape[0] != int(image_grid_thw.prod(-1).sum())):
            return super().get_image_features(pixel_values, image_grid_thw, **kwargs)
        firsts, inverse = distinct_images(pixel_values, image_grid_thw)
        if len(firsts) == len(inverse):  # nothing repeats: the stock call
            return super().get_image_features(pixel_values, image_grid_thw, **kwargs)
        sizes = image_grid_thw.prod(-1).tolist()
        blocks = torch.split(pixel_values, sizes)
        unique_grid = image_grid_thw[firsts]
        out = super().get_image_features(torch.cat([blocks[i] for i in firsts]), unique_grid, return_dict=True)
        out.pooler_output = tuple(out.pooler_output[k] for k in inverse)
        if getattr(out, "last_hidden_state", None) is not None:
            per_image = torch.split(out.last_hidden_state, unique_grid.prod(-1).tolist())
            out.last_hidden_state = torch.cat([per_image[k] for k in inverse])
        return out

    def get_rope_index(self, input_ids, mm_token_type_ids=None, image_grid_thw=None, video_grid_thw=None,
                       attention_mask=None, **kwargs):
        flags = self.__dict__.get(_FLAGS, {})
        # the stock method ignores **kwargs too (generation passes its model kwargs: pixel_values, cache, ...)
        if not flags.get("rope_cache") or mm_token_type_ids is None or not isinstance(self, Qwen2VLModel) \
                or isinstance(self, Qwen2_5_VLModel):  # Qwen2.5-VL's index also reads video timing: the stock one
            return super().get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw,
                                          video_grid_thw=video_grid_thw, attention_mask=attention_mask, **kwargs)
        return _cached_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, attention_mask)


def _row_positions(model, types: list[int], grids: dict, device) -> torch.Tensor:
    """transformers' Qwen2VLModel.get_rope_index for one row (its masked token types), grids consumed in order."""
    merge = model.config.vision_config.spatial_merge_size
    current_pos, parts = 0, []
    for modality, group in itertools.groupby(types):
        n = len(list(group))
        if modality == 0:
            parts.append(torch.arange(n, device=device).view(1, -1).expand(3, -1) + current_pos)
            current_pos += n
        else:
            grid_thw = next(grids[modality])
            parts.append(model.get_vision_position_ids(current_pos, grid_thw, 1, merge, device=device))
            current_pos += max(grid_thw[1], grid_thw[2]) // merge
    return torch.cat(parts, dim=1).reshape(3, -1)


def _cached_rope_index(model, input_ids, mm_token_type_ids, image_grid_thw, video_grid_thw, attention_mask):
    cache = model.__dict__.setdefault("_harness_rope_rows", OrderedDict())
    position_ids = torch.zeros(3, input_ids.shape[0], input_ids.shape[1], dtype=input_ids.dtype, device=input_ids.device)
    grid_lists = {1: image_grid_thw.tolist() if image_grid_thw is not None else [],
                  2: video_grid_thw.tolist() if video_grid_thw is not None else []}
    used = {1: 0, 2: 0}
    grid_rows = {1: image_grid_thw, 2: video_grid_thw}
    deltas = []
    masks = attention_mask.bool() if attention_mask is not None else None
    for b in range(input_ids.shape[0]):
        row_types = mm_token_type_ids[b] if masks is None else mm_token_type_ids[b][masks[b]]
        types = row_types.tolist()
        counts = {1: 0, 2: 0}
        for modality, _ in itertools.groupby(types):
            if modality:
                counts[modality] += 1
        grids = {m: grid_lists[m][used[m]:used[m] + counts[m]] for m in (1, 2)}
        key = (tuple(types), tuple(map(tuple, grids[1])), tuple(map(tuple, grids[2])))
        hit = cache.get(key)
        if hit is None:
            iters = {m: iter(grid_rows[m][used[m]:used[m] + counts[m]]) for m in (1, 2) if grid_rows[m] is not None}
            positions = _row_positions(model, types, iters, input_ids.device)
            hit = (positions, int(positions.max()) + 1 - len(types))
            cache[key] = hit
            if len(cache) > ROPE_CACHE_ROWS:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        used[1] += counts[1]
        used[2] += counts[2]
        positions, delta = hit
        if masks is None:
            position_ids[:, b] = positions.to(position_ids.device)
        else:
            position_ids[:, b, masks[b]] = positions.to(position_ids.device)
        deltas.append(delta)
    return position_ids, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


class FastQwen2VLModel(_FastVision, Qwen2VLModel):
    pass


class FastQwen2_5_VLModel(_FastVision, Qwen2_5_VLModel):
    pass


_FAST = {Qwen2VLModel: FastQwen2VLModel, Qwen2_5_VLModel: FastQwen2_5_VLModel}


# --- the processor's row dedupe (model.dedupe_rows): a batch that repeats rows is processed once per distinct
# row and gathered back. Tokenizing and preprocessing are per row and per image, and the padded width is the same
# maximum, so the result is the same, tensor for tensor (tests/unit/test_fastvision.py).


def _pixels_key(img) -> bytes:
    return hashlib.blake2b(f"{img.mode}:{img.size}:".encode() + img.tobytes(), digest_size=16).digest()


def distinct_rows(images, text, kwargs) -> tuple[list[int], list[int]] | None:
    """(first row of each distinct (text, image pixels) row, each row's position among them); None when the call
    is not a batch of text rows with a list of PIL images each (and padding / return_tensors at most), or when
    nothing repeats."""
    from PIL import Image

    if (not isinstance(text, list) or not isinstance(images, list) or len(text) != len(images) or len(text) < 2
            or set(kwargs) - {"padding", "return_tensors"} or kwargs.get("return_tensors") not in (None, "pt")):
        return None
    keys = []
    for t, imgs in zip(text, images):
        if not isinstance(t, str) or not isinstance(imgs, list) or not all(isinstance(i, Image.Image) for i in imgs):
            return None
        keys.append((t, tuple(_pixels_key(i) for i in imgs)))
    index: dict = {}
    inverse = [index.setdefault(k, len(index)) for k in keys]
    if len(index) == len(keys):
        return None
    firsts = [0] * len(index)
    for row in range(len(keys) - 1, -1, -1):
        firsts[inverse[row]] = row
    return firsts, inverse


def gather_rows(out, inverse: list[int], images_per_row: list[int]):
    """A processor output of distinct rows -> the output of the rows `inverse` names: per-row keys gathered by row;
    the image keys (a block of grid t*h*w pixel rows and one grid row per image) gathered image by image."""
    import numpy as np

    grid = out.get("image_grid_thw")
    starts = np.cumsum([0, *images_per_row])
    order = [i for r in inverse for i in range(starts[r], starts[r + 1])]
    gathered = {}
    for key, value in out.items():
        if key == "image_grid_thw":
            gathered[key] = value[order]
        elif key == "pixel_values":
            sizes = [int(x) for x in grid.prod(-1)]
            if isinstance(value, torch.Tensor):
                blocks = value.split(sizes)
                gathered[key] = torch.cat([blocks[i] for i in order])
            else:
                blocks = np.split(value, np.cumsum(sizes)[:-1])
                gathered[key] = np.concatenate([blocks[i] for i in order])
        elif len(value) == len(images_per_row):  # input_ids, attention_mask, mm_token_type_ids: one entry per row
            gathered[key] = value[inverse] if isinstance(value, torch.Tensor) else [value[r] for r in inverse]
        else:
            raise ValueError(f"row dedupe: processor output {key!r} is neither per row nor per image")
    return type(out)(gathered, tensor_type=None)


def _dedupe_call(call, images=None, text=None, audio=None, **kwargs):
    rows = distinct_rows(images, text, kwargs) if audio is None else None
    if rows is None:
        return call(images=images, text=text, audio=audio, **kwargs)
    firsts, inverse = rows
    out = call(images=[images[i] for i in firsts], text=[text[i] for i in firsts], audio=audio, **kwargs)
    return gather_rows(out, inverse, [len(images[i]) for i in firsts])


def dedupe_rows(processor, on: bool) -> bool:
    """The row dedupe on or off for the tiny models' processor (HarnessVLProcessor); False for any other."""
    from harness.models.processor import HarnessVLProcessor

    if not isinstance(processor, HarnessVLProcessor):
        return False
    if on:
        processor.__dict__["_harness_row_dedupe"] = _dedupe_call
    else:
        processor.__dict__.pop("_harness_row_dedupe", None)
    return on


def install(model, *, share_vision_features: bool, rope_cache: bool):
    """Turn the shortcuts on or off in every Qwen2-VL / Qwen2.5-VL base model inside `model`; returns the number
    of base models found (0 for other models, left as they are)."""
    found = 0
    for module in model.modules():
        base = next((stock for stock in _FAST if type(module) in (stock, _FAST[stock])), None)
        if base is None:
            continue
        module.__class__ = _FAST[base]
        module.__dict__[_FLAGS] = {"share_vision_features": bool(share_vision_features), "rope_cache": bool(rope_cache)}
        found += 1
    return found
