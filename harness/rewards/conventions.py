"""How a reward function written for TRL, verl or EasyR1 is called from the harness's one calling form.

The harness calls every reward function as TRL calls its `reward_funcs`, every argument by keyword:

    g(prompts=, completions=, completion_ids=, **columns) -> list[float]          one float per completion

columns (one entry per completion): target, answer_type, relation, question, key, choices, meta, truncated,
data_source; plus trainer_state (None in eval) and the function's own reward.kwargs (any other keyword).
`adapt(fn, convention, name)` returns such a g for a function written for `convention`:

trl     fn itself, every keyword passed through (TRL's GRPOTrainer._calculate_rewards: reward_func(prompts=,
        completions=, completion_ids=, **reward_kwargs), reward_kwargs = the dataset columns + trainer_state).
verl    per completion, as verl's reward managers call `custom_reward_function` (verl/workers/reward_manager/
        naive.py; verl/experimental/reward_loop/reward_manager/naive.py at v0.9.0), every argument by keyword:
            fn(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)
        reward_kwargs merged over the call's keywords, as verl/trainer/ppo/reward.py's _call_with_kwargs does (they
        win). A number is the score; a dict must hold "score" (the others are extra info: `g.last_info`). An async
        compute_score is awaited (verl does).
        data_source <- the data_source column, solution_str <- the completion's text, ground_truth <- target,
        extra_info <- a copy of the row's meta (or {}) with what verl's data and manager put there and the harness
        has: split / index from meta.source_split / source_index (convert-hf's: the source dataset's split and row,
        as verl's preprocessing scripts record them) unless meta has them, question (the row's question, as the
        preprocessing scripts' extra_info.question) unless meta has it, num_turns = 2 (a single-turn rollout, as
        verl's single-turn agent loop counts it) and rollout_reward_scores = {} (no rollout-side scores), which
        verl's manager sets on every call.
easyr1  as EasyR1's reward managers call `worker.reward.reward_function` (verl/workers/reward/function.py), the
        reward_function_kwargs bound by keyword (functools.partial):
            batch:       fn([reward_input, ...], **kwargs) -> [score, ...]        one call for all completions
            sequential:  fn(reward_input, **kwargs) -> score                      one call per completion
        reward_input = {"response": text, "response_length": tokens, "ground_truth": target} (EasyR1's RewardInput:
        response_length counts the response's tokens up to and including end-of-sequence, its response_mask sum =
        len(completion_ids) as TRL passes them); a score is a dict whose "overall" is the reward (its other keys,
        e.g. format / accuracy, are extra info: `g.last_info`). Batch or sequential: upstream EasyR1 reads the
        loaded module's REWARD_TYPE ("batch" when absent); the PAPO fork reads the config field
        worker.reward.reward_type instead. adapt's `reward_type` wins; else the function's module's REWARD_TYPE;
        else "batch".

Also: `signature_problem` (plan time, from the parameters an AST gives, nothing imported), `kwargs_problem`
(reward.kwargs keys the calling form reserves), `declared_reward_type` (EasyR1's REWARD_TYPE read from source),
and the port's helpers `verl_target` / `easyr1_target` (a source's config -> reward._target_).

Standard library only; torch-free (the planner and the port import it).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import numbers
from typing import Any, Callable, Iterable, Mapping, Sequence

CONVENTIONS = ("trl", "verl", "easyr1")
#: the dataset columns the harness passes, one entry per completion
COLUMNS = ("target", "answer_type", "relation", "question", "key", "choices", "meta", "truncated", "data_source")
#: what TRL passes besides the columns (the harness passes trainer_state; TRL itself also the others)
TRL_EXTRAS = ("trainer_state", "log_extra", "log_metric", "environments")
CALL = ("prompts", "completions", "completion_ids")
#: keywords of the calling form: any other keyword is the function's reward.kwargs
RESERVED = CALL + COLUMNS + TRL_EXTRAS
#: what the harness passes a trl-convention function (TRL passes these plus log_extra / log_metric)
TRL_PASSED = CALL + COLUMNS + ("trainer_state",)
VERL_PASSED = ("data_source", "solution_str", "ground_truth", "extra_info")
EASYR1_TYPES = ("batch", "sequential")

SIGNATURES = {
    "trl": "f(prompts, completions, completion_ids, **kwargs) -> list[float], every argument passed by keyword "
           f"(kwargs: the columns {', '.join(COLUMNS)}, trainer_state, and reward.kwargs)",
    "verl": "compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | "
            "dict with 'score', called once per completion, every argument by keyword (kwargs: reward.kwargs)",
    "easyr1": "compute_score(reward_inputs: list[dict], **kwargs) -> list[dict with 'overall'] (REWARD_TYPE = "
              "'batch', EasyR1's default) or compute_score(reward_input: dict, **kwargs) -> dict with 'overall' "
              "(REWARD_TYPE = 'sequential'); the inputs positional, kwargs (reward.kwargs) by keyword",
}


class RewardResultError(TypeError):
    """A reward function returned what its convention does not read as a reward; the message names the function,
    the convention and the value."""


# --- calling


def adapt(fn: Callable, convention: str, name: str, *, reward_type: str | None = None) -> Callable:
    """A function with the harness's calling form that calls `fn` as its framework does (module docstring) and
    returns one float per completion. `name` names it in errors. `reward_type` (easyr1 only): "batch" |
    "sequential"; None reads REWARD_TYPE from fn's module globals (EasyR1 reads it from the module it loaded the
    function from: pass declared_reward_type(source) when the function is imported into that file), default batch.
    The returned function's `last_info` holds, after each call, the extra numeric keys of dict results (one dict
    per completion; empty for plain numbers)."""
    if convention not in CONVENTIONS:
        raise ValueError(f"{name}: reward convention {convention!r} is not one of {', '.join(CONVENTIONS)}")
    if convention == "easyr1":
        rtype = reward_type if reward_type is not None else easyr1_reward_type(fn)
        if rtype not in EASYR1_TYPES:
            raise ValueError(f"{name}: EasyR1 reward type {rtype!r} is not one of {', '.join(EASYR1_TYPES)} "
                             "(EasyR1 refuses it too: 'Unsupported reward type')")
        g = _easyr1(fn, name, rtype)
    elif convention == "verl":
        g = _verl(fn, name)
    else:
        g = _trl(fn, name)
    g.__name__ = getattr(fn, "__name__", name)
    g.__qualname__ = g.__name__
    g.__doc__ = getattr(fn, "__doc__", None)
    g.__wrapped__ = fn
    g.convention = convention
    g.reward_name = name
    g.last_info = []
    return g


def easyr1_reward_type(fn: Callable) -> str:
    """REWARD_TYPE of fn's module (EasyR1's declaration), "batch" when it declares none (EasyR1's default)."""
    glb = getattr(inspect.unwrap(fn), "__globals__", None)
    if glb is None:
        mod = inspect.getmodule(fn)
        glb = vars(mod) if mod is not None else {}
    return glb.get("REWARD_TYPE", "batch")


def _split(kw: Mapping[str, Any]) -> tuple[dict, dict]:
    """(the calling form's keywords, the function's reward.kwargs)."""
    cols = {k: v for k, v in kw.items() if k in RESERVED}
    return cols, {k: v for k, v in kw.items() if k not in RESERVED}


def _column(cols: Mapping[str, Any], key: str, n: int, default: Any = None) -> list:
    values = cols.get(key)
    return [default] * n if values is None else list(values)


def _texts(completions: Sequence[Any]) -> list[str]:
    from harness.rewards.builtin import completion_text

    return [completion_text(c) for c in completions]


def _short(value: Any, width: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _number(value: Any) -> float | None:
    """value as a float when it is a real number (bool, int, float, a numpy scalar, a 0-d array/tensor), else None."""
    if isinstance(value, numbers.Real):  # bool is an int; numpy's scalars register as numbers.Real
        return float(value)
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) else None
    return None


def _bad(name: str, convention: str, value: Any, where: str, expected: str) -> RewardResultError:
    return RewardResultError(f"reward function {name} ({convention} convention) returned {_short(value)} "
                             f"({type(value).__name__}){where}: {expected}")


def _scored(result: Any, key: str, name: str, convention: str, where: str, expected: str) -> tuple[float, dict]:
    """(the reward, the other numeric keys) of a number or a dict holding `key`."""
    if isinstance(result, Mapping):
        if key not in result:
            raise _bad(name, convention, result, where, f"a dict result must hold {key!r} (the reward); {expected}")
        score = _number(result[key])
        if score is None:
            raise _bad(name, convention, result[key], f"{where} as {key!r}", f"{key!r} must be a number; {expected}")
        info = {k: x for k, x in ((k, _number(v)) for k, v in result.items() if k != key) if x is not None}
        return score, info
    score = _number(result)
    if score is None:
        raise _bad(name, convention, result, where, expected)
    return score, {}


def _listed(result: Any, n: int, name: str, convention: str, expected: str) -> list:
    if hasattr(result, "tolist") and not isinstance(result, (list, tuple)):  # a numpy array or a tensor
        result = result.tolist()
    if not isinstance(result, (list, tuple)):
        raise _bad(name, convention, result, f" for {n} completions", expected)
    if len(result) != n:
        raise RewardResultError(f"reward function {name} ({convention} convention) returned {len(result)} results "
                                f"for {n} completions: {expected}")
    return list(result)


def _awaited(value: Any) -> Any:
    return asyncio.run(value) if inspect.isawaitable(value) else value


def _trl(fn: Callable, name: str) -> Callable:
    expected = "return a list with one number per completion"

    def g(prompts, completions, completion_ids, **kw):
        result = _awaited(fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw))
        values = _listed(result, len(completions), name, "trl", expected)
        out = []
        for i, v in enumerate(values):
            x = _number(v)
            if x is None:  # None too: TRL reads it as NaN (not applicable), the harness needs a reward everywhere
                raise _bad(name, "trl", v, f" for completion {i}", f"{expected} (None, strings and lists are not "
                           "rewards)")
            out.append(x)
        g.last_info = [{} for _ in out]
        return out

    return g


def verl_extra_info(meta: Any, question: Any) -> dict:
    """extra_info of one completion (module docstring): a fresh dict per call."""
    info = dict(meta) if isinstance(meta, Mapping) else {}
    if "source_split" in info:
        info.setdefault("split", info["source_split"])
    if "source_index" in info:
        info.setdefault("index", info["source_index"])
    if question is not None:
        info.setdefault("question", question)
    info["num_turns"] = 2
    info["rollout_reward_scores"] = {}
    return info


def _verl(fn: Callable, name: str) -> Callable:
    expected = "verl reads a number, or a dict with 'score'"
    is_async = inspect.iscoroutinefunction(inspect.unwrap(fn))

    def g(prompts, completions, completion_ids, **kw):
        cols, reward_kwargs = _split(kw)
        n = len(completions)
        texts = _texts(completions)
        sources, targets = _column(cols, "data_source", n, ""), _column(cols, "target", n)
        metas, questions = _column(cols, "meta", n), _column(cols, "question", n)
        calls = [{"data_source": sources[i], "solution_str": texts[i], "ground_truth": targets[i],
                  "extra_info": verl_extra_info(metas[i], questions[i]), **reward_kwargs} for i in range(n)]
        if is_async:
            async def gather():
                return await asyncio.gather(*(fn(**c) for c in calls))
            results = asyncio.run(gather())
        else:
            results = [_awaited(fn(**c)) for c in calls]
        scored = [_scored(r, "score", name, "verl", f" for completion {i}", expected) for i, r in enumerate(results)]
        g.last_info = [info for _, info in scored]
        return [s for s, _ in scored]

    return g


def _easyr1(fn: Callable, name: str, reward_type: str) -> Callable:
    expected = "EasyR1 reads a dict with 'overall' per completion"

    def g(prompts, completions, completion_ids, **kw):
        cols, reward_kwargs = _split(kw)
        n = len(completions)
        texts, targets = _texts(completions), _column(cols, "target", n)
        ids = list(completion_ids) if completion_ids is not None else [None] * n
        inputs = [{"response": texts[i], "response_length": len(ids[i]) if ids[i] is not None else 0,
                   "ground_truth": targets[i]} for i in range(n)]
        if reward_type == "batch":
            results = _listed(_awaited(fn(inputs, **reward_kwargs)), n, name, "easyr1",
                              "a batch function (REWARD_TYPE = 'batch') returns a list with one dict per completion")
        else:
            results = [_awaited(fn(x, **reward_kwargs)) for x in inputs]
        scored = []
        for i, r in enumerate(results):
            if not isinstance(r, Mapping):
                raise _bad(name, "easyr1", r, f" for completion {i}", expected)
            scored.append(_scored(r, "overall", name, "easyr1", f" for completion {i}", expected))
        g.last_info = [info for _, info in scored]
        return [s for s, _ in scored]

    return g


# --- plan time: will it be callable?


def _param(p: Sequence) -> tuple[str, str, bool | None]:
    return str(p[0]), str(p[1]), (bool(p[2]) if len(p) > 2 and p[2] is not None else None)


def signature_problem(fn_params: Iterable[Sequence], convention: str, kwargs: Iterable[str] = ()) -> str | None:
    """Why a function with these parameters cannot be called in `convention`, or None when it can.

    fn_params: (name, kind) per parameter, in order, kind an inspect.Parameter kind name (POSITIONAL_ONLY,
    POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD); an optional third item True/False says
    whether the parameter has a default (without it, a parameter the call does not fill is assumed to have one).
    kwargs: the names of the function's reward.kwargs (passed by keyword on every call).
    """
    if convention not in CONVENTIONS:
        return f"reward convention {convention!r} is not one of {', '.join(CONVENTIONS)}"
    params = [_param(p) for p in fn_params]
    extra = [k for k in kwargs if k not in RESERVED]
    var_kw = any(k == "VAR_KEYWORD" for _, k, _ in params)
    var_pos = any(k == "VAR_POSITIONAL" for _, k, _ in params)
    sig = SIGNATURES[convention]
    consumed = None  # the parameter that takes easyr1's positional reward input(s)
    if convention == "easyr1":
        passed = tuple(extra)
        first = next(((n, k) for n, k, _ in params if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")), None)
        if first is None and not var_pos:
            return (f"easyr1 convention: EasyR1 passes the reward inputs as the first positional argument; this "
                    f"function takes no positional parameter. Expected {sig}")
        if first is not None:
            consumed = first[0]
            if first[0] in passed:
                return (f"easyr1 convention: reward.kwargs.{first[0]} would also fill {first[0]!r}, the parameter "
                        f"that receives the reward inputs. Expected {sig}")
    else:
        passed = (TRL_PASSED if convention == "trl" else VERL_PASSED) + tuple(extra)
    by_keyword = {n for n, k, _ in params if k in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY") and n != consumed}
    refused = [n for n in passed if n not in by_keyword] if not var_kw else []
    if refused:
        who = {"trl": "TRL calls it", "verl": "verl calls it", "easyr1": "EasyR1 calls it"}[convention]
        what = ", ".join(refused)
        more = (" (name every column, or take **kwargs for the ones it does not use)" if convention == "trl"
                else "")
        return (f"{convention} convention: {who} with the keyword argument{'s' if len(refused) > 1 else ''} {what}, "
                f"which the function does not accept{more}. Expected {sig}")
    unfilled = []
    for n, k, has_default in params:
        if n == consumed or k in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if k == "POSITIONAL_ONLY" and (has_default is False or (has_default is None and n in passed)):
            unfilled.append(f"{n} (positional-only: the call passes it by keyword)")
        elif k != "POSITIONAL_ONLY" and has_default is False and n not in passed:
            unfilled.append(n)
    if unfilled:
        return (f"{convention} convention: the call does not fill the parameter{'s' if len(unfilled) > 1 else ''} "
                f"{', '.join(unfilled)}, which {'have' if len(unfilled) > 1 else 'has'} no default (give "
                f"{'them' if len(unfilled) > 1 else 'it'} one, or pass {'them' if len(unfilled) > 1 else 'it'} in "
                f"reward.kwargs). Expected {sig}")
    return None


def kwargs_problem(kwargs: Iterable[str]) -> str | None:
    """reward.kwargs keys that the calling form already uses (they would be taken for the harness's columns)."""
    taken = [k for k in kwargs if k in RESERVED]
    if taken:
        return (f"reward.kwargs {', '.join(taken)}: {'these names are' if len(taken) > 1 else 'this name is'} "
                f"taken by the harness's calling form ({', '.join(RESERVED)})")
    return None


def declared_reward_type(source: str) -> str | None:
    """The module-level `REWARD_TYPE = "..."` of a Python source (EasyR1's batch/sequential declaration), or None
    when it assigns none (or not a string literal, or the source does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        else:
            targets = [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if any(isinstance(t, ast.Name) and t.id == "REWARD_TYPE" for t in targets):
            value = node.value
            found = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return found


# --- the port: a source's config -> reward._target_


def verl_target(path: str, name: str | None) -> str:
    """reward._target_ of verl's custom_reward_function.path / .name (verl.utils.import_utils.load_module: a file
    path, `file://PATH`, or `pkg://dotted.module` / `pkg://dotted/module`); name None -> compute_score."""
    name = name or "compute_score"
    if path.startswith("pkg://"):
        return f"{path[len('pkg://'):].replace('/', '.')}:{name}"
    if path.startswith("file://"):
        path = path[len("file://"):]
    return f"{path}:{name}"


def easyr1_target(reward_function: str) -> tuple[str, str]:
    """(file, function) of EasyR1's worker.reward.reward_function: 'path.py:name', or a bare path whose function
    is `main` (EasyR1's RewardConfig.post_init: rsplit(':', 1), else reward_function_name = 'main')."""
    if ":" not in reward_function:
        return reward_function, "main"
    path, name = reward_function.rsplit(":", 1)
    return path, name
