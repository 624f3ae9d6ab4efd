"""Model building: tiny local Qwen-VL / Qwen2 models (seeded random weights, a locally trained
byte-level BPE, an image-only processor), their cache, loading and identity.

    from harness.models import build_tiny, load_tiny, model_identity, special_token_ids_to_suppress

    path = build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny=cfg.model.tiny,
                      corpus=texts, cache_dir=cfg.model.cache_dir)
    model, processor = load_tiny(path)             # (model, tokenizer) for family qwen2
    ids = special_token_ids_to_suppress(processor)  # GRPOConfig(generation_kwargs={"suppress_tokens": ids})

Importing this package is light (stdlib only; no torch, transformers or trl), so planning can
compute a tiny model's cache key and verify its files. It also arranges that
`transformers.AutoProcessor.from_pretrained(<tiny VLM dir or a checkpoint of one>)` works in this
process: the saved processor class (HarnessVLProcessor) is registered with AutoProcessor as soon
as transformers' processing_auto module is imported (a one-shot import hook below), or at once
when it already is. Without `import harness.models` first, AutoProcessor cannot resolve
"HarnessVLProcessor" in a tiny model's cache dir and falls back to a bare tokenizer; a run's final_policy/
carries the class's code for that case (harness.portable: `trust_remote_code=True`).
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings

from harness.models.tiny import (
    BUILDER_VERSION,
    ModelCacheError,
    build_tiny,
    load_tiny,
    model_identity,
    special_token_ids_to_suppress,
    tiny_key,
    tiny_model_dir,
)

__all__ = [
    "BUILDER_VERSION",
    "ModelCacheError",
    "build_tiny",
    "load_tiny",
    "model_identity",
    "special_token_ids_to_suppress",
    "tiny_key",
    "tiny_model_dir",
    "register_auto_classes",
]

# --- AutoProcessor registration without importing transformers now

_AUTO_MODULE = "transformers.models.auto.processing_auto"


def register_auto_classes() -> None:
    """Register HarnessVLProcessor with AutoProcessor now (imports transformers; idempotent)."""
    from harness.models.processor import register_auto_classes as _register

    _register()


def _register_quietly() -> None:
    own = sys.modules.get("harness.models.processor")
    if own is not None and not hasattr(own, "register_auto_classes"):
        return  # processing_auto was imported BY our processor module, which registers at its end
    try:
        register_auto_classes()
    except Exception as err:  # never break someone else's `import transformers`
        warnings.warn(f"harness.models could not register HarnessVLProcessor with AutoProcessor: {err!r}",
                      stacklevel=2)  # fmt: skip


class _LoaderThenRegister(importlib.abc.Loader):
    """Runs the real loader of processing_auto, then registers our processor class."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _register_quietly()

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._inner, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """One-shot meta-path finder: wraps the loader of transformers' processing_auto module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _AUTO_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from recursing
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _LoaderThenRegister(spec.loader)
                return spec
        return None


def _install() -> None:
    if _AUTO_MODULE in sys.modules:
        _register_quietly()  # transformers (and torch) are already loaded: nothing to keep light
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


_install()
