"""harness.rewards.conventions: a verl or EasyR1 reward function called from the harness's one calling form (TRL's
reward_funcs signature) the way its own framework calls it; wrong returns named; signatures checked from their
parameters alone. The functions below are modelled on verl's verl/utils/reward_score/gsm8k.py and EasyR1's
examples/reward_function/{math,r1v}.py (same key names and signatures; the grading simplified, no mathruler)."""

from __future__ import annotations

import re

import pytest

from harness.rewards.conventions import (RESERVED, RewardResultError, adapt, declared_reward_type, easyr1_target,
                                        kwargs_problem, signature_problem, verl_target)

# --- the calling form: what the harness passes


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def call(g, texts, targets, *, ids=None, meta=None, **kwargs):
    n = len(texts)
    return g(prompts=[[{"role": "user", "content": "q"}]] * n, completions=[chat(t) for t in texts],
             completion_ids=ids if ids is not None else [[1] * (len(t) + 1) for t in texts],
             target=list(targets), answer_type=["number"] * n, relation=["FULL"] * n,
             question=[f"question {i}" for i in range(n)], key=[f"k{i}" for i in range(n)], choices=[None] * n,
             meta=meta if meta is not None else [None] * n, truncated=[False] * n, data_source=["jsonl"] * n,
             trainer_state=None, **kwargs)


# --- verl: verl/utils/reward_score/gsm8k.py's scoring behind a custom_reward_function signature


def extract_solution(solution_str, method="strict"):
    solution_str = solution_str[-300:]
    if method == "strict":
        solutions = re.findall("#### (\\-?[0-9\\.\\,]+)", solution_str)
        return solutions[-1].replace(",", "").replace("$", "") if solutions else None
    answer = [a for a in re.findall("(\\-?[0-9\\.\\,]+)", solution_str) if a not in ("", ".")]
    return answer[-1] if answer else None


def gsm8k_compute_score(data_source, solution_str, ground_truth, extra_info=None, method="strict", format_score=0.0,
                        score=1.0):
    answer = extract_solution(solution_str=solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score


def test_verl_compute_score_per_completion_with_reward_kwargs():
    g = adapt(gsm8k_compute_score, "verl", "gsm8k.py:compute_score")
    out = call(g, ["so #### 72", "so #### 7", "no answer"], ["72", "72", "72"], format_score=0.1)
    assert out == [1.0, 0.1, 0.0] and all(type(x) is float for x in out)
    assert g.__name__ == "gsm8k_compute_score" and g.last_info == [{}, {}, {}]


def test_verl_arguments_by_keyword_and_extra_info():
    seen = []

    def compute_score(*, data_source, solution_str, ground_truth, extra_info, **kwargs):
        seen.append(dict(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                         extra_info=extra_info, kwargs=kwargs))
        return 1

    meta = [{"source_split": "train", "source_index": 7}, {"split": "test", "question": "mine"}]
    g = adapt(compute_score, "verl", "f.py:compute_score")
    assert call(g, ["a", "b"], ["1", "2"], meta=meta, tolerance=0.5) == [1.0, 1.0]
    assert [s["solution_str"] for s in seen] == ["a", "b"] and [s["ground_truth"] for s in seen] == ["1", "2"]
    assert seen[0]["data_source"] == "jsonl" and seen[0]["kwargs"] == {"tolerance": 0.5}  # no harness column leaks
    assert seen[0]["extra_info"] == {"source_split": "train", "source_index": 7, "split": "train", "index": 7,
                                     "question": "question 0", "num_turns": 2, "rollout_reward_scores": {}}
    assert seen[1]["extra_info"]["split"] == "test" and seen[1]["extra_info"]["question"] == "mine"  # meta wins
    assert meta[0] == {"source_split": "train", "source_index": 7}  # the row's meta is not mutated
    call(g, ["c"], ["3"])
    assert seen[-1]["extra_info"] == {"question": "question 0", "num_turns": 2, "rollout_reward_scores": {}}


def test_verl_dict_result_score_and_extra_info():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 0.5 if solution_str == ground_truth else -0.5, "acc": solution_str == ground_truth,
                "pred": solution_str}

    g = adapt(compute_score, "verl", "f.py:compute_score")
    assert call(g, ["4", "5"], ["4", "4"]) == [0.5, -0.5]
    assert g.last_info == [{"acc": 1.0}, {"acc": 0.0}]  # numeric extras kept, the string dropped


def test_verl_async_compute_score_awaited():
    async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == ground_truth)

    assert call(adapt(compute_score, "verl", "f.py:compute_score"), ["1", "2"], ["1", "1"]) == [1.0, 0.0]


@pytest.mark.parametrize("result,needle", [({"acc": 1.0}, "must hold 'score'"), ("1.0", "str"), (None, "NoneType"),
                                           ({"score": "high"}, "'score' must be a number"), ([1.0], "list")])
def test_verl_bad_returns_name_function_convention_value(result, needle):
    g = adapt(lambda data_source, solution_str, ground_truth, extra_info: result, "verl", "rw.py:compute_score")
    with pytest.raises(RewardResultError) as e:
        call(g, ["x"], ["y"])
    msg = str(e.value)
    assert "rw.py:compute_score" in msg and "verl convention" in msg and needle in msg
    assert repr(result["score"] if isinstance(result, dict) and "score" in result else result) in msg


# --- EasyR1: examples/reward_function/math.py (batch) and r1v.py (sequential), loaded as modules


EASYR1_MATH = '''
import re
from typing import Any

# Metadata
REWARD_NAME = "math"
REWARD_TYPE = "batch"
CALLS = []


def extract_boxed_content(response):
    m = re.findall(r"\\\\boxed\\{(.*?)\\}", response)
    return m[-1] if m else ""


def format_reward(response: str) -> float:
    pattern = re.compile(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", re.DOTALL)
    return 1.0 if re.fullmatch(pattern, response) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    return 1.0 if extract_boxed_content(response) == ground_truth else 0.0


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    CALLS.append(reward_inputs)
    scores = []
    for reward_input in reward_inputs:
        response = re.sub(r"\\s*(<|>|/)\\s*", r"\\1", reward_input["response"])
        format_score = format_reward(response)
        accuracy_score = accuracy_reward(response, reward_input["ground_truth"])
        scores.append({"overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
                       "format": format_score, "accuracy": accuracy_score})
    return scores
'''

EASYR1_R1V = '''
import re
from typing import Any

# Metadata
REWARD_NAME = "r1v"
REWARD_TYPE = "sequential"
CALLS = []


def format_reward(response: str) -> float:
    pattern = re.compile(r"<think>.*?</think>\\s*<answer>.*?</answer>", re.DOTALL)
    return 1.0 if re.fullmatch(pattern, response) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    content_match = re.search(r"<answer>(.*?)</answer>", response)
    given_answer = content_match.group(1).strip() if content_match else response.strip()
    return 1.0 if given_answer == ground_truth.strip() else 0.0


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    CALLS.append(reward_input)
    format_score = format_reward(reward_input["response"])
    accuracy_score = accuracy_reward(reward_input["response"], reward_input["ground_truth"])
    return {"overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
            "format": format_score, "accuracy": accuracy_score}
'''


def module(source: str) -> dict:
    ns: dict = {"__name__": "custom_reward_fn"}
    exec(compile(source, "reward.py", "exec"), ns)
    return ns


def test_easyr1_batch_one_call_with_reward_inputs():
    ns = module(EASYR1_MATH)
    g = adapt(ns["compute_score"], "easyr1", "examples/reward_function/math.py:compute_score")
    texts = ["<think>t</think> so \\boxed{3}", "\\boxed{3}", "<think>t</think> \\boxed{4}"]
    out = call(g, texts, ["3", "3", "3"], ids=[[5, 6, 2], [5, 2], [5, 6, 7, 8, 2]], format_weight=0.5)
    assert out == [1.0, 0.5, 0.5]
    assert len(ns["CALLS"]) == 1  # batch: one call for every completion
    assert ns["CALLS"][0] == [{"response": texts[0], "response_length": 3, "ground_truth": "3"},
                              {"response": texts[1], "response_length": 2, "ground_truth": "3"},
                              {"response": texts[2], "response_length": 5, "ground_truth": "3"}]
    assert g.last_info[0] == {"format": 1.0, "accuracy": 1.0}


def test_easyr1_sequential_one_call_per_completion():
    ns = module(EASYR1_R1V)
    g = adapt(ns["compute_score"], "easyr1", "r1v.py:compute_score")
    texts = ["<think>a</think> <answer>7</answer>", "<answer>8</answer>"]
    out = call(g, texts, ["7", "7"], ids=[[1] * 9, [2] * 4])
    assert out == [1.0, 0.0]  # format_weight 0.5 by default: (1 + 1) / 2, (0 + 0) / 2
    assert ns["CALLS"] == [{"response": texts[0], "response_length": 9, "ground_truth": "7"},
                           {"response": texts[1], "response_length": 4, "ground_truth": "7"}]
    # adapt's reward_type wins over the module's declaration (the PAPO fork's worker.reward.reward_type)
    batch = module(EASYR1_MATH)
    del batch["REWARD_TYPE"]  # absent: EasyR1's default, batch
    assert call(adapt(batch["compute_score"], "easyr1", "m.py:compute_score"), ["\\boxed{1}"], ["1"]) == [0.9]
    seq = module(EASYR1_MATH)
    with pytest.raises(TypeError):  # math.py called sequentially gets a dict where it iterates a list
        call(adapt(seq["compute_score"], "easyr1", "m.py:compute_score", reward_type="sequential"), ["x"], ["1"])


def test_easyr1_unknown_reward_type_refused():
    ns = module(EASYR1_MATH.replace('"batch"', '"parallel"'))
    with pytest.raises(ValueError, match="'parallel'"):
        adapt(ns["compute_score"], "easyr1", "m.py:compute_score")


@pytest.mark.parametrize("result,needle", [([{"accuracy": 1.0}], "must hold 'overall'"), ([1.0], "float"),
                                           ([{"overall": None}], "'overall' must be a number"),
                                           ([{"overall": 1.0}] * 2, "returned 2 results for 1 completions"),
                                           ({"overall": 1.0}, "dict")])
def test_easyr1_bad_returns_name_function_convention_value(result, needle):
    ns = module("REWARD_TYPE = 'batch'\ndef compute_score(reward_inputs):\n    return RESULT\n")
    ns["RESULT"] = result
    with pytest.raises(RewardResultError) as e:
        call(adapt(ns["compute_score"], "easyr1", "bad.py:compute_score"), ["x"], ["y"])
    msg = str(e.value)
    assert "bad.py:compute_score" in msg and "easyr1 convention" in msg and needle in msg


# --- trl: passed through


def test_trl_passes_everything_through_and_checks_the_result():
    seen = {}

    def f(prompts, completions, completion_ids, **kwargs):
        seen.update(kwargs)
        return (1, 0.5)

    g = adapt(f, "trl", "f.py:f")
    assert call(g, ["a", "b"], ["1", "2"], tolerance=3) == [1.0, 0.5]
    assert set(seen) == {"target", "answer_type", "relation", "question", "key", "choices", "meta", "truncated",
                         "data_source", "trainer_state", "tolerance"}
    with pytest.raises(RewardResultError, match=r"f.py:f \(trl convention\) returned None"):
        call(adapt(lambda **kw: [None], "trl", "f.py:f"), ["a"], ["1"])
    with pytest.raises(ValueError, match="'sklearn' is not one of"):
        adapt(f, "sklearn", "f.py:f")


# --- plan time: signatures from their parameters


P, K, KO, VK, VP, PO = ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY", "KEYWORD_ONLY", "VAR_KEYWORD", "VAR_POSITIONAL",
                        "POSITIONAL_ONLY")


def params(*names, kind=P):
    return [(n, kind) for n in names]


def test_signature_trl():
    assert signature_problem(params("prompts", "completions", "completion_ids") + [("kwargs", VK)], "trl") is None
    assert signature_problem(params("completions") + [("kw", VK)], "trl") is None
    why = signature_problem(params("prompts", "completions", "completion_ids", "target"), "trl")
    assert why.startswith("trl convention: TRL calls it with the keyword arguments answer_type, relation")
    assert "**kwargs" in why and "Expected f(prompts, completions, completion_ids, **kwargs)" in why
    # a parameter the call never fills: refused when it is known to have no default
    assert signature_problem([("completions", P), ("solution", P, False), ("kw", VK)], "trl").endswith(
        "Expected " + "f(prompts, completions, completion_ids, **kwargs) -> list[float], every argument passed by "
        "keyword (kwargs: the columns target, answer_type, relation, question, key, choices, meta, truncated, "
        "data_source, trainer_state, and reward.kwargs)")
    assert "solution" in signature_problem([("completions", P), ("solution", P, False), ("kw", VK)], "trl")
    assert signature_problem([("completions", P), ("solution", P, True), ("kw", VK)], "trl") is None
    assert signature_problem([("completions", P), ("solution", P, False), ("kw", VK)], "trl", ["solution"]) is None
    assert "positional-only" in signature_problem([("prompts", PO), ("kw", VK)], "trl")


def test_signature_verl():
    verl_sig = params("data_source", "solution_str", "ground_truth", "extra_info")
    assert signature_problem(verl_sig, "verl") is None
    assert signature_problem([(n, K) for n, _ in verl_sig], "verl") is None  # keyword-only is fine: all by keyword
    # verl's gsm8k.compute_score itself is not a custom_reward_function: verl passes data_source= and extra_info=
    why = signature_problem(params("solution_str", "ground_truth", "method", "format_score", "score"), "verl")
    assert why.startswith("verl convention: verl calls it with the keyword arguments data_source, extra_info")
    assert "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)" in why
    assert "tolerance" in signature_problem(verl_sig, "verl", ["tolerance"])
    assert signature_problem(verl_sig + [("kwargs", VK)], "verl", ["tolerance"]) is None


def test_signature_easyr1():
    assert signature_problem([("reward_inputs", P), ("format_weight", P, True)], "easyr1") is None
    assert signature_problem([("reward_inputs", P), ("format_weight", P, True)], "easyr1", ["format_weight"]) is None
    dapo = [("reward_inputs", P), ("max_response_length", P, False), ("overlong_buffer_length", P, False),
            ("overlong_penalty_factor", P, False)]
    assert "max_response_length, overlong_buffer_length" in signature_problem(dapo, "easyr1")  # needs its kwargs
    assert signature_problem(dapo, "easyr1", ["max_response_length", "overlong_buffer_length",
                                              "overlong_penalty_factor"]) is None
    assert "format" in signature_problem([("reward_inputs", P)], "easyr1", ["format"])
    assert "no positional parameter" in signature_problem([("reward_inputs", K)], "easyr1")
    assert signature_problem([("args", VP)], "easyr1") is None
    assert "receives the reward inputs" in signature_problem([("reward_inputs", P)], "easyr1", ["reward_inputs"])
    assert "'nemo' is not one of" in signature_problem([], "nemo")


def test_kwargs_problem_reserved_names():
    assert kwargs_problem(["tolerance", "format_weight"]) is None
    why = kwargs_problem(["target", "tolerance"])
    assert why.startswith("reward.kwargs target: this name is taken") and "trainer_state" in why
    assert set(RESERVED) >= {"prompts", "completions", "completion_ids", "data_source", "trainer_state"}


def test_declared_reward_type_and_targets():
    assert declared_reward_type(EASYR1_MATH) == "batch" and declared_reward_type(EASYR1_R1V) == "sequential"
    assert declared_reward_type("def compute_score(x): pass") is None
    assert declared_reward_type("REWARD_TYPE: str = 'sequential'") == "sequential"
    assert declared_reward_type("def (") is None
    assert verl_target("recipe/r.py", None) == "recipe/r.py:compute_score"
    assert verl_target("file://recipe/r.py", "score") == "recipe/r.py:score"
    assert verl_target("pkg://my_pkg/rewards", "score") == "my_pkg.rewards:score"
    assert easyr1_target("./examples/reward_function/math.py:compute_score") == (
        "./examples/reward_function/math.py", "compute_score")
    assert easyr1_target("examples/reward.py") == ("examples/reward.py", "main")
