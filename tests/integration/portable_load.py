"""Load a final_policy/ the way a user without the harness would, and generate from an image (a script, run by
tests/integration/test_portable_policy.py and test_qwen_checkpoint.py in a fresh `python -I` process, outside the
repo).

    python -I portable_load.py FOLDER IMAGE ROUTE OUT_JSON      ROUTE: auto | peft=<base dir> | pretrained

The harness (and arms, tests) cannot be imported here, not even through the venv's editable install: a
meta-path finder placed first refuses them. What the test asserts comes back in OUT_JSON: the processor's class
and module, the keys of its output, the pixel_values the vision tower received (a forward hook), the logits of
one forward pass, the generated ids, the harness modules loaded (none), what AutoProcessor does without
trust_remote_code=True, and (a real checkpoint) whether its output equals the stock processor's or, without
torchvision, the same built by hand from the tokenizer and the image processor.
"""

import importlib.abc
import json
import sys

BLOCKED = ("harness", "arms", "tests")


class NoHarness(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ImportError(f"{fullname}: this process must load the policy without the harness")
        return None


sys.meta_path.insert(0, NoHarness())

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import AutoModelForImageTextToText, AutoProcessor  # noqa: E402


QUESTION = "Is the red square left of the blue circle?"


def pieces(folder: str, image):
    """What a Qwen-VL processor makes, from the folder's own tokenizer, image processor and chat template: on a
    machine without torchvision transformers 5 cannot build any Qwen-VL processor (each wants a video processor)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    tok, ip = AutoTokenizer.from_pretrained(folder), AutoImageProcessor.from_pretrained(folder)
    template = json.load(open(f"{folder}/chat_template.json"))["chat_template"]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
    pixels = ip(images=[image], return_tensors="pt")
    n = int(pixels["image_grid_thw"][0].prod()) // ip.merge_size ** 2
    ids = tok(text.replace("<|image_pad|>", "<|image_pad|>" * n), add_special_tokens=False, return_tensors="pt")
    return {**ids, "mm_token_type_ids": (ids["input_ids"] == tok.convert_tokens_to_ids("<|image_pad|>")).long(),
            **pixels}


def call(processor, picture):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    return processor(images=[picture], text=[prompt], return_tensors="pt")


def main(folder: str, image: str, route: str, out: str) -> None:
    """ROUTE: auto | peft=<base dir> (the tiny VLMs' processor code ships in the folder), or pretrained (a real
    checkpoint's processor files and the image-only form of its processor class). Every route loads the processor
    with trust_remote_code=True, as the model card says. `reference`: for pretrained, what the stock processor
    makes where torchvision imports (AutoProcessor without trust_remote_code), else `pieces`."""
    picture = Image.open(image).convert("RGB")
    reference = None
    if route == "pretrained":
        try:  # without the opt-in: the stock Qwen-VL processor, which needs torchvision for its video part
            stock = AutoProcessor.from_pretrained(folder)
            refused, reference = type(stock).__name__, ("stock", call(stock, picture))
        except ImportError as exc:
            refused, reference = "ImportError: " + str(exc).strip().splitlines()[0], ("pieces", pieces(folder, picture))
    else:
        try:  # without the opt-in: refused (before the custom code it fell back to a bare tokenizer, silently)
            refused = type(AutoProcessor.from_pretrained(folder, trust_remote_code=False)).__name__
        except ValueError as exc:
            refused = "ValueError: " + str(exc).splitlines()[0]
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
    inputs = call(processor, picture)
    if route.startswith("peft="):
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(route.removeprefix("peft=")),
                                          folder)
    else:  # a full model, or an adapter whose base its config names (transformers' PEFT integration)
        model = AutoModelForImageTextToText.from_pretrained(folder)
    model.eval()
    seen = []
    (visual,) = [m for n, m in model.named_modules() if n.endswith("visual") and n.count("visual") == 1]
    visual.register_forward_hook(lambda mod, args, kwargs, output: seen.append(list(args[0].shape)), with_kwargs=True)
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
        gen = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    json.dump({
        "question": QUESTION, "without_trust_remote_code": refused,
        "reference": reference and reference[0],
        "equal_to_reference": reference and {k: bool(torch.equal(inputs[k], v)) for k, v in reference[1].items()},
        "processor_class": type(processor).__name__, "processor_module": type(processor).__module__,
        "model_class": type(model).__name__, "input_keys": sorted(inputs.keys()),
        "pixel_values_shape": list(inputs["pixel_values"].shape) if "pixel_values" in inputs else None,
        "vision_tower_inputs": seen, "input_ids": inputs["input_ids"][0].tolist(),
        "logits": logits.tolist(), "generated": gen[0, inputs["input_ids"].shape[1]:].tolist(),
        "lora_modules": sum("lora_A" in n for n, _ in model.named_parameters()),
        "harness_modules": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
    }, open(out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
