"""Processed images cached per image digest: the same pixels are never preprocessed twice.

Why: a GRPO step hands each prompt's image to the processor once per completion (TRL repeats the prompt
G times) and twice per generation batch (TRL's prompt tokenization, then its scoring inputs); evi_po
re-scores under the same MISSING/CONTROL images, and the direction metric of the eval repeats an image
per candidate. Measured on the tiny VLM: 64 preprocessings of 4 distinct images per step (32 rows, two
calls), 11 ms per call, ~5% of a 0.36 s step (cProfile, 20 steps).

`install(processor, max_mb)` puts a `CachedImageProcessor` in front of the processor's image processor.
It answers a call image by image from an LRU keyed by (image digest, call arguments): the digest is
blake2b over the decoded pixels, mode and size, so a re-decoded copy of the same file hits, and a
changed image misses. Misses are preprocessed together by the real image processor in one call and
split per image. The result is the same tensors as without the cache (Qwen-VL image processors
preprocess every image on its own and concatenate: pinned by tests/unit/test_image_cache.py), which
is why `model.image_cache_mb` is not part of the semantic identity.

Only what it can split exactly is cached: PIL images in, `pixel_values` (patches, D) + `image_grid_thw`
(images, 3) out, as torch tensors or numpy arrays. Anything else (numpy or tensor images, other output
keys, other return types) goes to the real image processor untouched. Saving, pickling and deep-copying see the real
image processor, so a saved processor is byte-identical with and without the cache.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict

OUT_KEYS = {"pixel_values", "image_grid_thw"}


def image_digest(img) -> bytes:
    """blake2b-128 of a PIL image's decoded pixels, mode and size."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{img.mode}:{img.size[0]}x{img.size[1]}:".encode())
    h.update(img.tobytes())
    return h.digest()


def _size(piece) -> int:
    return sum(int(x.nbytes) for x in piece)


def _flat_pil(images) -> list | None:
    """The PIL images of a call (one image, a list, or a list of lists) in order; None if any is not PIL."""
    from PIL import Image

    if isinstance(images, Image.Image):
        return [images]
    if not isinstance(images, (list, tuple)):
        return None
    flat = []
    for x in images:
        if isinstance(x, Image.Image):
            flat.append(x)
        elif isinstance(x, (list, tuple)) and all(isinstance(y, Image.Image) for y in x):
            flat.extend(x)
        else:
            return None
    return flat


class CachedImageProcessor:
    """An image processor with an LRU of its per-image outputs; everything else is the real one's."""

    def __init__(self, inner, max_bytes: int):
        d = self.__dict__
        d["_inner"], d["max_bytes"], d["_cache"] = inner, int(max_bytes), OrderedDict()
        d["bytes"] = d["hits"] = d["misses"] = d["bypassed"] = 0

    # -- the real image processor for everything else (attributes, saving, copying, pickling)

    def __getattr__(self, name):
        return getattr(self.__dict__["_inner"], name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)

    def __deepcopy__(self, memo):
        return copy.deepcopy(self._inner, memo)

    def __reduce__(self):
        return (CachedImageProcessor, (self._inner, self.max_bytes))

    def __repr__(self):
        return f"CachedImageProcessor({self.max_bytes >> 20} MB, {len(self._cache)} images) of {self._inner!r}"

    @property
    def inner(self):
        return self._inner

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "bypassed": self.bypassed, "images": len(self._cache),
                "mb": round(self.bytes / 2**20, 1), "max_mb": self.max_bytes >> 20}

    # -- the cached path

    def __call__(self, images, *args, **kwargs):
        return self.preprocess(images, *args, **kwargs)

    def preprocess(self, images, *args, **kwargs):
        flat = None if args or kwargs.get("return_tensors") not in (None, "np", "pt") else _flat_pil(images)
        if not flat:
            return self._bypass(images, *args, **kwargs)
        call = repr(sorted(kwargs.items())).encode()
        keys = [image_digest(img) + call for img in flat]
        found, todo = {}, {}  # key -> cached piece; key -> image (the first occurrence of each missing key)
        for key, img in zip(keys, flat):
            if key in found or key in todo:
                continue
            if key in self._cache:
                self._cache.move_to_end(key)
                found[key] = self._cache[key]
            else:
                todo[key] = img
        if todo:
            fresh = self._inner.preprocess(list(todo.values()), **kwargs)
            pieces = self._split(fresh, len(todo))
            if pieces is None:  # not a layout this cache can split exactly: answer this call as is
                self.__dict__["bypassed"] += 1
                return fresh if len(todo) == len(flat) else self._inner.preprocess(images, **kwargs)
            for key, piece in zip(todo, pieces):
                found[key] = piece
                self._put(key, piece)
        self.__dict__["hits"] += len(flat) - len(todo)
        self.__dict__["misses"] += len(todo)
        return self._assemble([found[k] for k in keys])

    def _bypass(self, images, *args, **kwargs):
        self.__dict__["bypassed"] += 1
        return self._inner.preprocess(images, *args, **kwargs)

    @staticmethod
    def _split(out, n: int):
        """Per image (pixel rows, grid row), copied; None unless `out` is exactly the Qwen-VL layout (torch
        tensors or numpy arrays)."""
        import numpy as np
        import torch

        if set(out.keys()) != OUT_KEYS:
            return None
        pv, grid = out["pixel_values"], out["image_grid_thw"]
        if not all(torch.is_tensor(x) for x in (pv, grid)) and not all(isinstance(x, np.ndarray) for x in (pv, grid)):
            return None
        if tuple(grid.shape) != (n, 3):
            return None
        starts = np.cumsum([0, *grid.prod(-1).tolist()]).tolist()  # patches per image: t * h * w
        if starts[-1] != pv.shape[0]:
            return None
        copy_ = (lambda x: x.clone()) if torch.is_tensor(pv) else (lambda x: x.copy())
        return [(copy_(pv[a:b]), copy_(grid[i])) for i, (a, b) in enumerate(zip(starts, starts[1:]))]

    def _put(self, key: bytes, piece) -> None:
        self._cache[key] = piece
        self.__dict__["bytes"] += _size(piece)
        while self.bytes > self.max_bytes and self._cache:
            _, old = self._cache.popitem(last=False)
            self.__dict__["bytes"] -= _size(old)

    @staticmethod
    def _assemble(pieces: list):
        import numpy as np
        import torch
        from transformers.image_processing_utils import BatchFeature

        pvs, grids = [p for p, _ in pieces], [g for _, g in pieces]
        if torch.is_tensor(pvs[0]):
            return BatchFeature(data={"pixel_values": torch.cat(pvs), "image_grid_thw": torch.stack(grids)})
        return BatchFeature(data={"pixel_values": np.concatenate(pvs), "image_grid_thw": np.stack(grids)})


def install(processor, max_mb: int):
    """Put a CachedImageProcessor of `max_mb` MB in front of the processor's image processor (0: none);
    returns the processor. A processor without an image processor (a tokenizer) is returned as is."""
    inner = getattr(processor, "image_processor", None)
    if inner is None or max_mb <= 0:
        return processor
    if isinstance(inner, CachedImageProcessor):
        inner = inner.inner
    processor.image_processor = CachedImageProcessor(inner, max_mb * 2**20)
    return processor


def stats(processor) -> dict | None:
    ip = getattr(processor, "image_processor", None)
    return ip.stats() if isinstance(ip, CachedImageProcessor) else None
