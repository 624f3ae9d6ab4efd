"""Two shortcuts in the Qwen2-VL / Qwen2.5-VL forward that change no result: each distinct image of a forward is
encoded once, and the M-RoPE positions of a row are computed once per row layout.

Why: TRL repeats each prompt G times in the batch, so a GRPO step's prefill and loss forward run the vision tower
on G identical copies of each image (32 images for 4 distinct ones in the default job), and transformers'
`get_rope_index` walks every row in Python (itertools.groupby over its token types, a meshgrid per image).
Measured on the tiny VLM (2 cores, one GRPO step ~0.36 s): the vision tower 11 ms per no-grad forward and 25 ms
forward + backward on 32 images, 2.8 / 6.5 ms on the 4 distinct ones; `get_rope_index` ~10 ms per call, two
calls a step (bench/RESULTS.md).

- `model.dedupe_images`: `get_image_features` finds identical images (same grid, same pixel rows: torch.equal),
  runs the vision tower on the distinct ones and hands every copy its features. The features are bit for bit the
  ones the tower gives each copy (the tower encodes every image on its own: its attention is per image, and a
  linear layer's row does not depend on the other rows; tests/unit/test_fastvision.py pins it). The gradient of
  the vision tower is the same sum over the copies, taken in another float order (the copies' gradients are added
  before the tower's backward, not inside its matmuls): weights agree to ~1e-7, which is why the knob is not part
  of the semantic identity, like gradient checkpointing (tests/integration/test_invariance.py).
- `model.rope_cache`: `get_rope_index` answers each row from a small LRU keyed by the row's token types (after
  the attention mask) and the grids of its images; a miss computes the row with transformers' own algorithm.
  Integer positions: the same tensors, bit for bit.

Installed on a loaded model by `install(model, dedupe_images=..., rope_cache=...)`, which swaps the class of the
inner Qwen2VLModel / Qwen2_5_VLModel (PEFT-wrapped or not) for a subclass defined here: deep copies (a reference
model) and pickles keep it, the weights and the saved files do not change (save_pretrained writes the outer
model's config and state dict). Other model classes are left as they are. Anything outside the plain path
(videos, extra kwargs, hidden states or attentions asked for) goes to transformers' code untouched.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import torch
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

ROPE_CACHE_ROWS = 4096  # row layouts kept (a (3, L) int64 tensor each: ~1 KB for the tiny job's rows)
_FLAGS = "_harness_fastvision"  # instance attribute: {"dedupe_images": bool, "rope_cache": bool}


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
        if (not flags.get("dedupe_images") or image_grid_thw is None or extra
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


def install(model, *, dedupe_images: bool, rope_cache: bool):
    """Turn the shortcuts on or off in every Qwen2-VL / Qwen2.5-VL base model inside `model`; returns the number
    of base models found (0 for other models, left as they are)."""
    found = 0
    for module in model.modules():
        base = next((stock for stock in _FAST if type(module) in (stock, _FAST[stock])), None)
        if base is None:
            continue
        module.__class__ = _FAST[base]
        module.__dict__[_FLAGS] = {"dedupe_images": bool(dedupe_images), "rope_cache": bool(rope_cache)}
        found += 1
    return found
