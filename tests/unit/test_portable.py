"""What makes a final policy portable (harness.portable) and its model card (harness.card), on small fake folders
and a composed plan: torch-free and fast. The real runs are in tests/integration/test_portable_policy.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from harness.card import provisional_card, render_card
from harness.accounting.weights import weights_digest
from harness.config.schema import ModelConfig, TrainConfig
from harness.config.typed import from_json
from harness.portable import PROCESSOR_CODE, PROCESSOR_SOURCE, make_portable
from tests.conftest import REPO


def test_the_shipped_processor_module_imports_transformers_only():
    """processing_harness_vl.py runs in a process without the harness (trust_remote_code): no harness import."""
    from harness.models import tokenizer

    tree = ast.parse(PROCESSOR_SOURCE.read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and all(m == "__future__" or m.split(".")[0] == "transformers" for m in imported), imported
    assert PROCESSOR_SOURCE == REPO / "harness" / "models" / "processor.py"
    consts = {n.targets[0].id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Constant)}
    for name in ("VISION_START", "VISION_END", "IMAGE_PAD", "VIDEO_PAD"):  # spelled out there, defined here
        assert consts[name] == getattr(tokenizer, name)


def _folder(tmp: Path, processor_class: str | None = "HarnessVLProcessor", adapter: bool = False,
            run: str = "run") -> Path:
    fp = tmp / run / "final_policy"
    fp.mkdir(parents=True)
    if processor_class:
        (fp / "processor_config.json").write_text(json.dumps({"processor_class": processor_class}))
    if adapter:
        (fp / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/abs/cache/tiny", "r": 16}))
        (fp / "adapter_model.safetensors").write_bytes(b"adapter")
    return fp


def _base(tmp: Path) -> Path:
    base = tmp / "cache" / "tiny-qwen2_vl-abc"
    base.mkdir(parents=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        (base / name).write_bytes(name.encode())
    return base


TINY = {"source": "tiny", "hub_id": None}
NO_PUSH = {"push_to_hub": False, "hub_model_id": None}


def _model(d: dict) -> ModelConfig:
    """A model config as a run manifest's dict reads back: through the typed schema (the rest: its defaults)."""
    return from_json(ModelConfig, d)


def _train(d: dict) -> TrainConfig:
    return from_json(TrainConfig, d)


def test_the_tiny_processor_ships_its_code_with_an_auto_map(tmp_path):
    fp = _folder(tmp_path)
    got = make_portable(fp, model_cfg=_model(TINY), train_cfg=_train(NO_PUSH), base_path=str(tmp_path))
    assert got == {"processor_code": PROCESSOR_CODE, "base_files": []}
    assert json.loads((fp / "processor_config.json").read_text())["auto_map"] == {
        "AutoProcessor": "processing_harness_vl.HarnessVLProcessor"}
    assert (fp / PROCESSOR_CODE).read_bytes() == PROCESSOR_SOURCE.read_bytes()


def test_a_stock_processor_and_a_tokenizer_are_left_alone(tmp_path):
    stock, tok = _folder(tmp_path, "Qwen2VLProcessor", run="a"), _folder(tmp_path, None, run="b")
    for fp in (stock, tok):
        assert make_portable(fp, model_cfg=_model(TINY), train_cfg=_train(NO_PUSH), base_path="x")["processor_code"] is None
        assert not (fp / PROCESSOR_CODE).exists()
    assert json.loads((stock / "processor_config.json").read_text()) == {"processor_class": "Qwen2VLProcessor"}


def test_a_tiny_adapter_stores_its_base_and_names_this_folder(tmp_path):
    fp, base = _folder(tmp_path, adapter=True), _base(tmp_path)
    got = make_portable(fp, model_cfg=_model(TINY), train_cfg=_train(NO_PUSH), base_path=str(base))
    assert got["base_files"] == ["config.json", "generation_config.json", "model.safetensors"]
    assert all((fp / n).read_bytes() == (base / n).read_bytes() for n in got["base_files"])
    assert not (fp / "tokenizer.json").exists()  # the processor files are the policy's own
    cfg = json.loads((fp / "adapter_config.json").read_text())
    assert cfg == {"base_model_name_or_path": ".", "r": 16}
    pushed = _folder(tmp_path, adapter=True, run="pushed")
    make_portable(pushed, model_cfg=_model(TINY), train_cfg=_train({"push_to_hub": True, "hub_model_id": "me/tiny"}),
                  base_path=str(base))
    assert json.loads((pushed / "adapter_config.json").read_text())["base_model_name_or_path"] == "me/tiny"


def test_a_real_adapter_names_the_hub_model_not_the_cache_path(tmp_path):
    fp = _folder(tmp_path, "Qwen2VLProcessor", adapter=True)
    real = {"source": "pretrained", "hub_id": "Qwen/Qwen2-VL-2B-Instruct"}
    got = make_portable(fp, model_cfg=_model(real), train_cfg=_train(NO_PUSH), base_path="/hf/snapshots/abc")
    assert got["base_files"] == [] and got["adapter_base"]["portable"]
    assert json.loads((fp / "adapter_config.json").read_text())["base_model_name_or_path"] == real["hub_id"]
    assert not (fp / "model.safetensors").exists()
    local = make_portable(_folder(tmp_path, adapter=True, run="local"), model_cfg=_model({"source": "pretrained", "hub_id": None}),
                          train_cfg=_train(NO_PUSH), base_path="/ckpt")
    assert not local["adapter_base"]["portable"] and "model.hub_id" in local["adapter_base"]["note"]


def test_the_weights_digest_leaves_out_the_stored_base_and_the_card(tmp_path):
    def digest(files: dict, base_files: list) -> str:
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "harness_policy.json").write_text(json.dumps({"files": files, "base_files": base_files}))
        return weights_digest(d)

    adapter = {"adapter_model.safetensors": {"sha256": "a" * 64}}
    extra = {"model.safetensors": {"sha256": "b" * 64}, "README.md": {"sha256": "c" * 64},
             PROCESSOR_CODE: {"sha256": "d" * 64}}
    assert digest({**adapter, **extra}, ["model.safetensors"]) == digest(adapter, [])
    assert digest({**adapter, **extra}, []) != digest(adapter, [])  # base weights not declared: counted


def _eval(run: Path, name: str, acc: float, rels: dict) -> None:
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / f"{name}.json").write_text(json.dumps({
        "n": 64, "accuracy": acc, "per_relation": {r: {"n": 16, "accuracy": a} for r, a in rels.items()}}))


def test_the_card_of_a_papo_run_says_papo_its_budget_and_its_evals(plan_of, tmp_path):
    plan = plan_of("arm=papo", "debug=tiny")
    run = tmp_path / "run"
    run.mkdir()
    _eval(run, "test-before", 0.25, {"FULL": 0.0, "MISSING": 1.0})
    _eval(run, "test", 0.5, {"FULL": 0.5, "MISSING": 0.5})
    comp = {"optimizer_steps": 7, "stopped_by": "budget", "nonfinite_steps": 0, "realized_completion_tokens": 1234,
            "realized_completion_count": 56, "completion_token_ceiling": plan.budget["completion_token_ceiling"]}
    identity = {**plan.identity, "data": {**plan.identity["data"], "content_sha256": "d" * 64},
                "model": {**plan.identity["model"], "files_sha256": "f" * 64, "base_path": "/c/tiny-qwen2_vl-0123"}}
    policy = {"tuning": "full", "weights_sha256": "w" * 64, "portable": {"processor_code": PROCESSOR_CODE}}
    card = render_card(plan, run, identity, comp, policy)
    assert "**PAPO** (`arm=papo`: GRPO + implicit perception loss" in card
    assert "trained with GRPO" not in card and "[None]" not in card
    for text in (f"# {plan.run_name}", plan.identity["semantic_sha256"], plan.identity["config_sha256"], "d" * 64,
                 "f" * 64, "w" * 64, f"| sampled completion tokens | {comp['completion_token_ceiling']} "
                 "(budget.max_completion_tokens) | 1234 |", "| optimizer steps | at most",
                 "| overall | 0.250 | 0.500 |", "| FULL | 0.000 | 0.500 |", "| MISSING | 1.000 | 0.500 |",
                 f"the SFT warm start `{plan.parent.run_name}`", "Stopped by: budget",
                 "python -m harness " + " ".join(plan.overrides), "tiny-qwen2_vl-0123",
                 "AutoProcessor.from_pretrained(path, trust_remote_code=True)", "- papo\n"):
        assert text in card, text


def test_the_provisional_card_says_the_run_is_not_finished(plan_of):
    plan = plan_of("arm=sft", "debug=tiny")
    card = provisional_card(plan)
    assert "(incomplete)" in card and "NOT finished" in card and "python -m harness " in card
