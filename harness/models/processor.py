"""Image-only Qwen-VL processors that work without torchvision: the tiny local VLMs', and a real checkpoint's
final policy's.

Why: in transformers 5.x every Qwen-VL processor (Qwen2VLProcessor, Qwen2_5_VLProcessor,
Qwen3VLProcessor) takes a video processor, and every video processor needs torchvision, which
cannot be installed next to the CPU torch wheel here (docs/platform.md "Installing"). The stock
processor cannot even be constructed. `HarnessVLProcessor` is Qwen2VLProcessor minus the video
processor: `ProcessorMixin.get_attributes` reads the sub-processors off `__init__`'s signature,
so an `__init__` without `video_processor` makes save/load/call skip video entirely.

One class serves all three families: their processors differ only in video handling (frame
timestamps for Qwen3-VL, second_per_grid_ts for Qwen2.5-VL); the image path (image_grid_thw,
<|image_pad|> x (t*h*w / merge^2), mm_token_type_ids for M-RoPE) is the same. The family-specific
parts are the image processor's settings (`image_processor_for`): patch 14 and CLIP mean/std for
Qwen2/2.5-VL, patch 16 and mean/std 0.5 for Qwen3-VL, as in the released checkpoints.

Images are never upscaled: min_pixels is one merged cell ((patch*merge)^2), so a 56x56 image at
patch 14 (or 64x64 at patch 16) stays 56x56 -> 4x4 patches -> 4 image tokens after the 2x2 merge.
max_pixels caps a large user image at MAX_IMAGE_TOKENS tokens.

Real checkpoints (`model=qwen`): a final policy keeps the checkpoint's stock processor class and ships this file
too, with the image-only form of that class in its auto_map (harness.portable.IMAGE_ONLY):
`Qwen2VLImageOnlyProcessor`, `Qwen2_5_VLImageOnlyProcessor`, `Qwen3VLImageOnlyProcessor`, each the stock class minus
its video processor, built as harness.models.pretrained.image_only builds it inside the harness (which
harness.models.parity holds equal to the stock class, key for key). `AutoProcessor.from_pretrained(final_policy,
trust_remote_code=True)` builds it, with or without torchvision; without trust_remote_code the stock class is built.

Reloading: the processor is saved with processor_class "HarnessVLProcessor". AutoProcessor finds
it by that name only in PROCESSOR_MAPPING's registered extras, so `register_auto_classes()` must
have run. `import harness.models` arranges it lazily (harness/models/__init__.py); importing
this module registers at once. On a machine with torchvision a real checkpoint's stock processor
is used unchanged; this class is for the tiny models.

Outside the harness: save_final_policy ships this file into final_policy/ as `processing_harness_vl.py`
with an `auto_map` in processor_config.json, the Hugging Face way for custom code, so
`AutoProcessor.from_pretrained(final_policy, trust_remote_code=True)` builds this class in a process that
never imports the harness. Hence the rule for this file: it imports transformers and nothing else.
"""

from __future__ import annotations

from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.auto.processing_auto import AutoProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin

# The Qwen vision tokens (harness.models.tokenizer defines them; a unit test keeps the two equal). Spelled out
# here because this file is also shipped into final_policy/ as its custom processor code (harness.artifacts):
# loaded with trust_remote_code=True in a process without the harness, it may import transformers only.
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

MERGE_SIZE = 2  # spatial merge of the Qwen-VL vision towers (2x2 patches -> 1 token)
TEMPORAL_PATCH_SIZE = 2  # a still image is repeated twice along time (Qwen-VL convention)
MAX_IMAGE_TOKENS = 64  # cap on tokens per image after the merge (a 448x448 image at patch 14)


def image_processor_for(family: str, patch_size: int) -> Qwen2VLImageProcessorPil:
    """The PIL (no torchvision) Qwen2-VL image processor with the family's settings."""
    cell = patch_size * MERGE_SIZE  # one merged token covers cell x cell pixels
    qwen3 = family == "qwen3_vl"
    return Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=cell * cell,  # never upscale beyond one token's cell
        max_pixels=cell * cell * MAX_IMAGE_TOKENS,
        image_mean=[0.5, 0.5, 0.5] if qwen3 else list(OPENAI_CLIP_MEAN),
        image_std=[0.5, 0.5, 0.5] if qwen3 else list(OPENAI_CLIP_STD),
    )


class HarnessVLProcessor(Qwen2VLProcessor):
    """Qwen2VLProcessor without a video processor (works for Qwen2-VL, Qwen2.5-VL, Qwen3-VL images).

    Calling it with `videos=` is refused: there is no video processor to run.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # Same token bookkeeping as Qwen2VLProcessor/Qwen3VLProcessor.__init__, which we cannot call:
        # it passes a video_processor positionally to ProcessorMixin.
        self.image_token = getattr(tokenizer, "image_token", None) or IMAGE_PAD
        self.video_token = getattr(tokenizer, "video_token", None) or VIDEO_PAD
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        self.vision_start_token = VISION_START
        self.vision_end_token = VISION_END
        self.vision_start_token_id = tokenizer.convert_tokens_to_ids(VISION_START)
        self.vision_end_token_id = tokenizer.convert_tokens_to_ids(VISION_END)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, videos=None, audio=None, **kwargs):
        if videos is not None:
            raise ValueError(
                "HarnessVLProcessor is image-only (no torchvision, so no video processor); "
                "pass images, or use the stock Qwen-VL processor on a machine with torchvision."
            )
        # The harness's row dedupe (harness.models.fastvision.dedupe_rows, from model.dedupe_rows): an instance
        # attribute, never saved; absent in a process without the harness.
        dedupe = self.__dict__.get("_harness_row_dedupe")
        if dedupe is not None:
            return dedupe(super().__call__, images=images, text=text, audio=audio, **kwargs)
        return super().__call__(images=images, text=text, audio=audio, **kwargs)


class _ImageOnly:
    """The image-only form of a stock Qwen-VL processor class (mixed in before it): what
    harness.models.pretrained.image_only makes of it, written out so a final policy can ship it (a class made by
    `type()` at run time has no source to ship). ProcessorMixin reads the sub-processors off `__init__`'s
    signature: without `video_processor` none is built, saved or loaded, and torchvision is never needed."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The stock __init__ does the token bookkeeping, then ProcessorMixin.__init__(image_processor, tokenizer,
        # video_processor, ...), which pairs positional sub-processors with get_attributes() (image_processor,
        # tokenizer here): the video processor's slot (None) is left over and dropped.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, audio=None, **kwargs):
        if videos is not None:
            raise ValueError(f"{type(self).__name__} is image-only (no video processor, so no torchvision needed); "
                             "pass images, or load the stock processor (AutoProcessor without trust_remote_code, "
                             "where torchvision imports) for videos")
        dedupe = self.__dict__.get("_harness_row_dedupe")  # model.dedupe_rows (harness.models.fastvision)
        if dedupe is not None:
            return dedupe(super().__call__, images=images, text=text, audio=audio, **kwargs)
        return super().__call__(images=images, text=text, audio=audio, **kwargs)


class Qwen2VLImageOnlyProcessor(_ImageOnly, Qwen2VLProcessor):
    """Qwen2VLProcessor without its video processor."""


class Qwen2_5_VLImageOnlyProcessor(_ImageOnly, Qwen2_5_VLProcessor):
    """Qwen2_5_VLProcessor without its video processor."""


class Qwen3VLImageOnlyProcessor(_ImageOnly, Qwen3VLProcessor):
    """Qwen3VLProcessor without its video processor."""


class _ProcessorRegistryKey:
    """Registry key for AutoProcessor.register. AutoProcessor resolves a saved processor by its
    class name (processor_config.json "processor_class") among the registered extras; the key is
    only consulted for a config of this exact type, which no model has, so stock Qwen-VL
    checkpoints keep their stock processors."""


def register_auto_classes() -> None:
    """Make AutoProcessor.from_pretrained find HarnessVLProcessor (idempotent)."""
    AutoProcessor.register(_ProcessorRegistryKey, HarnessVLProcessor, exist_ok=True)


register_auto_classes()
