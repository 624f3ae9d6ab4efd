"""Load the final_policy/ of a run on a real (pretrained) Qwen-VL checkpoint the way a user without the harness
would, and score one image (run by tests/integration/test_qwen_checkpoint.py in a fresh `python -I` process).

    python -I portable_load_pretrained.py FOLDER IMAGE OUT_JSON

The folder holds the checkpoint's own processor files and a LoRA adapter naming its base. Where torchvision
imports, `AutoProcessor.from_pretrained(folder)` builds the stock Qwen-VL processor; where it does not (this CPU
machine), transformers cannot build any Qwen-VL processor, so the script does what the processor does with the
folder's own pieces: AutoTokenizer, AutoImageProcessor, the chat template, each <|image_pad|> repeated once per
merged 2x2 patch block. The model: AutoModelForImageTextToText (transformers' PEFT integration loads the base and
the adapter). The harness (and arms, tests) cannot be imported here.
"""

import importlib.abc
import json
import sys

BLOCKED = ("harness", "arms", "tests")
QUESTION = "What color is the shape?"


class NoHarness(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname}: this process must load the policy without the harness")
        return None


sys.meta_path.insert(0, NoHarness())

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer  # noqa: E402


def inputs_by_hand(folder: str, image):
    """What the stock processor makes, from the folder's tokenizer, image processor and chat template."""
    tok = AutoTokenizer.from_pretrained(folder)
    ip = AutoImageProcessor.from_pretrained(folder)
    template = json.load(open(f"{folder}/chat_template.json"))["chat_template"]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    pixels = ip(images=[image], return_tensors="pt")
    n = int(pixels["image_grid_thw"][0].prod()) // ip.merge_size ** 2
    ids = tok(text.replace("<|image_pad|>", "<|image_pad|>" * n), add_special_tokens=False, return_tensors="pt")
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    return {**ids, "mm_token_type_ids": (ids["input_ids"] == image_id).long(), **pixels}, n


def main(folder: str, image_path: str, out: str) -> None:
    image = Image.open(image_path).convert("RGB")
    try:
        processor = AutoProcessor.from_pretrained(folder)
        route = f"AutoProcessor: {type(processor).__name__}"
    except ImportError as exc:  # transformers 5.x: every Qwen-VL processor needs torchvision for its video part
        processor, route = None, f"pieces ({str(exc).strip().splitlines()[0][:80]})"
    if processor is not None:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        n = int(inputs["image_grid_thw"][0].prod()) // 4
    else:
        inputs, n = inputs_by_hand(folder, image)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    seen = []
    (visual,) = [m for name, m in model.named_modules() if name.endswith("visual") and name.count("visual") == 1]
    visual.register_forward_hook(lambda mod, args, kwargs, output: seen.append(list(args[0].shape)), with_kwargs=True)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    json.dump({
        "route": route, "question": QUESTION, "model_class": type(model).__name__,
        "input_ids": inputs["input_ids"][0].tolist(), "image_tokens": n,
        "pixel_values_shape": list(inputs["pixel_values"].shape), "vision_tower_inputs": seen,
        "logits": logits.tolist(), "lora_modules": sum("lora_A" in name for name, _ in model.named_parameters()),
        "harness_modules": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
    }, open(out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
