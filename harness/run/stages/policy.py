"""The policy stage: the base model (built and cached, or found), the init (the parent's final policy,
scratch, or a path), tuning (LoRA or full) and the device; bound to the run's recorded model digest."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness import dist
from harness.errors import FieldDiff, ResumeMismatchError
from harness.policy import (Policy, apply_tuning, build_base, device_of, eos_token_ids, load_policy_model,
                            load_policy_processor)

if TYPE_CHECKING:
    from harness.config.schema import ModelConfig


def init_of(plan, base_path: str) -> dict:
    """Where the trained policy starts: {"kind": sft | scratch | path, "path": ...} (sft: the parent's)."""
    init = plan.kind.policy_init(plan.cfg)
    if init in (None, "scratch"):
        return {"kind": "scratch", "path": base_path}
    if init == "sft":
        parent_dir = Path(plan.parent.run_dir)
        return {"kind": "sft", "path": str(parent_dir / "final_policy"), "parent_run": plan.parent.run_name,
                "parent_run_dir": str(parent_dir)}
    return {"kind": "path", "path": init}


def fast_vision(model, processor, m: ModelConfig) -> None:
    """model.dedupe_rows (the tiny models' processor), model.share_vision_features and model.rope_cache (a loaded
    Qwen2-VL / Qwen2.5-VL) from harness.models.fastvision; other models and processors as they are."""
    if not m.is_vlm:
        return
    from harness.models import fastvision

    fastvision.install(model, share_vision_features=m.share_vision_features, rope_cache=m.rope_cache)
    fastvision.dedupe_rows(processor, m.dedupe_rows)


def build(plan, recorded: dict, corpus: list[str], run_dir: str, preflight=None) -> Policy:
    """The policy to train; `recorded` is the run's identity.model (a changed model refuses, exit 4). `preflight`
    (processor, context length) runs with the processor before the weights are loaded: a prompt that does not fit
    is refused without waiting for a large model to load."""
    from harness.models import imagecache
    from harness.models.pretrained import context_length

    base_path, base_ident = dist.main_first(build_base, plan, corpus)  # rank 0 builds the cached model
    files = recorded.get("files_sha256")
    if files and base_ident.get("files_sha256") and files != base_ident["files_sha256"]:
        raise ResumeMismatchError(run_dir, [FieldDiff("identity.model.files_sha256", files,
                                                      base_ident["files_sha256"])],
                                  "the model files changed since this run started; restore them, or start a new "
                                  "run (another output_root)")
    init = init_of(plan, base_path)
    m = plan.cfg.model
    processor = load_policy_processor(init["path"], base_path=base_path, model_cfg=m)
    if preflight is not None:
        preflight(processor, context_length(base_path))
    model = load_policy_model(init["path"], base_path=base_path, model_cfg=m)
    imagecache.install(processor, m.image_cache_mb)
    fast_vision(model, processor, m)
    model = apply_tuning(model, plan)
    model.to(device_of(plan))
    return Policy(model, processor, base_path, base_ident, init, never_sampled(model, processor),
                  eos_token_ids(processor, model))


def never_sampled(model, processor) -> list[int]:
    """Token ids generation must never produce: the vision and chat specials, and the rows past the tokenizer."""
    from harness.models import special_token_ids_to_suppress

    return special_token_ids_to_suppress(processor) + rows_past_the_tokenizer(model, processor)


def rows_past_the_tokenizer(model, processor) -> list[int]:
    """Output rows no token of the tokenizer has: a released Qwen checkpoint pads its 151,665 tokens to 151,936
    rows. They are never sampled (a trained model gives them ~no mass; a random one would sample ids that decode
    to nothing)."""
    tok = getattr(processor, "tokenizer", processor)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rows = getattr(cfg, "vocab_size", None) or 0
    return list(range(len(tok), rows))
