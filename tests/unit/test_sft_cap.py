"""The SFT loss-token cap counts rows a chunk at a time (arms/sft/trainer.py apply_loss_token_cap): the same
prefix, the same per-row counts, the same stop and the same refusal as counting one row per collator call (the
reference below, the cap's earlier form), on the real collator, processor and synthetic data. No mocks."""

from __future__ import annotations

import pytest

from arms.sft.trainer import loss_tokens, row_loss_tokens


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from harness.data import ensure_synthetic, load_split
    from harness.models import build_tiny
    from harness.data.trainsets import corpus

    tmp = tmp_path_factory.mktemp("sftcap")
    root = ensure_synthetic(n_base=30, data_seed=0, image_size=56, cache_dir=tmp / "data")
    rows = load_split(root, "train")
    tiny = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                vision_width=32, vision_depth=1, vocab_size=400, init_seed=0)
    model_dir = build_tiny(family="qwen2_vl", is_vlm=True, patch_size=14, tiny=tiny, corpus=corpus(rows),
                           cache_dir=tmp / "model")
    return {"root": root, "rows": rows, "tmp": tmp, "model_dir": model_dir}


def _vary(example: dict, i: int) -> dict:
    """Rows of different lengths (the synthetic rows are all one length): a chunk's padding must not count."""
    prompt = [{**m, "content": m["content"] + " more" * (i % 4)} for m in example["prompt"]]
    completion = [{**m, "content": m["content"] + " ok" * (i % 3)} for m in example["completion"]]
    return {"prompt": prompt, "completion": completion}


def build(env, *overrides: str, chunk: int | None = None):
    """An SFT trainer as the harness builds it (the cap applied at build); with `chunk`, the cap applied once more to
    the whole epoch with `chunk` rows per collator call."""
    from arms import build_trainer
    from arms.common import BuildContext
    from arms.sft.trainer import apply_loss_token_cap
    from harness.cli import compose_plan
    from harness.models import fastvision, imagecache, load_tiny
    from harness.data.trainsets import sft_dataset

    plan = compose_plan(["arm=sft", f"output_root={env['tmp']}", "budget.max_steps=1000", *overrides])
    model, processor = load_tiny(env["model_dir"])
    fastvision.dedupe_rows(processor, True)  # as the policy stage installs them by default
    imagecache.install(processor, 16)
    ds = sft_dataset(env["root"], env["rows"], is_vlm=True, seed=plan.config["seed"]).map(_vary, with_indices=True)
    ctx = BuildContext(plan=plan, run_dir=env["tmp"] / "sft", model=model, processor=processor, train_dataset=ds)
    trainer = build_trainer("sft", ctx)
    if chunk is not None:
        trainer.train_dataset = ds
        apply_loss_token_cap(trainer, ctx, chunk=chunk)
    return trainer


def reference_cap(trainer, cap: int, max_len: int) -> dict | str:
    """The cap counted one row per collator call: {'per_row', 'limit'}, or the error's message."""
    ds = trainer.train_dataset  # the uncut epoch: build() is asked for a cap that never binds first
    counts, total, limit = [], 0, "epoch_end"
    for i in range(len(ds)):
        batch = trainer.data_collator([dict(ds[i])])
        if batch["input_ids"].shape[1] >= max_len:
            return f"train row {i} is "
        n = loss_tokens(batch["labels"])
        if total + n > cap:
            limit = "budget"
            break
        counts.append(n)
        total += n
    return {"per_row": counts, "limit": limit}


@pytest.mark.parametrize("chunk", [64, 7])
def test_chunked_counts_equal_one_row_counts(env, chunk):
    full = build(env, chunk=chunk)
    plan = full.harness_loss_token_plan
    ref = reference_cap(full, cap=10**9, max_len=full.args.max_length)
    assert plan["per_row"] == ref["per_row"] and plan["limit"] == ref["limit"] == "epoch_end"
    assert plan["rows"] == len(full.train_dataset) == len(env["rows"]) and plan["loss_tokens"] == sum(ref["per_row"])
    lengths, _ = row_loss_tokens(full.data_collator([dict(full.train_dataset[i]) for i in range(chunk)]))
    assert len(set(lengths)) > 1 and len(set(plan["per_row"])) > 1  # a chunk's rows differ: padding must not count


@pytest.mark.parametrize("chunk", [64, 7])
def test_a_cap_that_binds_inside_a_chunk_stops_at_the_same_row(env, chunk):
    full = build(env)
    per_row = full.harness_loss_token_plan["per_row"]
    cap = sum(per_row[:71]) - 1  # row 70 no longer fits: the 7th row of the 2nd chunk of 64
    capped = build(env, f"budget.max_loss_tokens={cap}", chunk=chunk).harness_loss_token_plan
    assert capped["per_row"] == per_row[:70] and capped["rows"] == 70 and capped["limit"] == "budget"


def test_a_row_at_max_length_is_refused_at_the_same_row(env):
    full = build(env)
    lengths = sorted({int(m.sum()) for m in (full.data_collator([dict(full.train_dataset[i])])["attention_mask"]
                                              for i in range(40))})
    max_len = lengths[len(lengths) // 2]  # some rows are shorter, some reach it
    ref = reference_cap(full, cap=10**9, max_len=max_len)
    assert isinstance(ref, str)
    with pytest.raises(ValueError) as err:
        build(env, f"arm.max_length={max_len}")
    assert str(err.value).startswith(ref) and f"at arm.max_length ({max_len})" in str(err.value)


def test_a_warm_start_whose_steps_end_with_its_last_pass_stopped_at_its_max_steps():
    """The colour set's warm start: 60 steps of 8 rows over 32 rows plans 15 passes, exactly 480 rows; it stopped at
    its max steps (it said "epoch_end" before: the end of the passes its steps had sized)."""
    from arms.sft.trainer import prefix_limit

    assert prefix_limit(60, 8, 480) == "max_steps"
    assert prefix_limit(60, 8, 3600) == "max_steps"  # one pass of the synthetic set holds every step
    assert prefix_limit(1000, 8, 480) == "epoch_end"  # arm.epochs ends the rows before budget.max_steps
