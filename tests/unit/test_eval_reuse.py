"""Which stored eval may stand for another evaluation of the same weights (harness.eval.reuse_mismatches)."""

from harness.eval import REUSE_KEYS, reuse_mismatches

WANTED = {"policy_sha256": "ab" * 32, "data_sha256": "cd" * 32, "split": "test", "max_items": None,
          "decoding": {"greedy": True, "max_new_tokens": 16, "batch_size": 64},
          "reward": {"correct": 1.0, "format_weight": 0.0, "invalid_penalty": 0.5},
          "reward_sources": {"main_source_sha256": "ef" * 32}, "code": {"commit": "x"}}


def _stored(**change):
    d = {k: v for k, v in WANTED.items() if k != "code"}
    d["identity"] = {"code": WANTED["code"]}
    d.update(change)
    return d


def test_the_same_evaluation_is_reusable():
    assert reuse_mismatches(_stored(), WANTED) == []


def test_every_setting_counts_and_a_missing_one_is_a_mismatch():
    for key in REUSE_KEYS:
        if key == "code":
            assert reuse_mismatches(_stored(identity={"code": {"commit": "y"}}), WANTED) == ["code"]
            continue
        assert reuse_mismatches(_stored(**{key: "other"}), WANTED) == [key]
        older = _stored()
        del older[key]
        if WANTED[key] is not None:
            assert reuse_mismatches(older, WANTED) == [key]
    assert "decoding" in reuse_mismatches(_stored(decoding={"greedy": True, "max_new_tokens": 16}), WANTED)


def test_nothing_is_reused_for_weights_without_a_digest():
    assert "policy_sha256" in reuse_mismatches(_stored(policy_sha256=None), {**WANTED, "policy_sha256": None})
