"""Reward functions: the configured `reward._target_` and `reward.components` found, checked, identified, called.

Every reward function is called in one form, TRL's `reward_funcs` signature:

    f(prompts, completions, completion_ids, **columns) -> list[float]     one float per completion

with the columns (one entry per completion) target, answer_type, relation, question, key, choices, meta,
truncated, data_source, plus trainer_state (None in eval) and the function's own reward.kwargs. A function
written for verl or EasyR1 is called their way (reward.convention, harness.rewards.conventions). The built-in
relation-aware reward (`harness.rewards:answer_reward`) is the default and one implementation of the form.

    total = main + sum(weight x component)

The plan checks every target without importing it (`reward_problems`: the file or module exists, the name is a
top-level function whose parameters fit the convention) and records its identity (harness.rewards.identity: the
target, the sha256 of its source file and of its parsed code). The code digest is the one compared, and the run name
carries it: an edited reward is a new run, a comment or a reformat the same run. The run loads
them (`Rewards`), and refuses a call's result that is not one finite number per completion, naming the function, the
completion's index in the call and its view. The user's exception ends the run with its traceback, once, as a
RewardFunctionError: the run is failed and resumable (no ledger row of the failed call is written).

Torch-free: the planner imports this module.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import os
import sys
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from harness.errors import HarnessError, Problem

BUILTIN = "harness.rewards:answer_reward"
COMPONENT_KEYS = ("_target_", "weight", "convention", "kwargs")  # reward.components.<name>
CONVENTIONS = ("trl", "verl", "easyr1")  # harness.config.fields.RewardConvention


class RewardFunctionError(HarnessError):
    """A reward function could not be loaded, or a call of it failed or returned what is not a reward."""

    exit_code = 11


@dataclass(frozen=True)
class FnRef:
    """One configured reward function: where it is and how it is called."""

    role: str  # "main", or the component's name
    field: str  # the config field naming it: reward._target_ or reward.components.<name>._target_
    target: str  # as configured
    name: str  # the function's name in its module
    module: str | None  # the dotted module (module form), None for a file path
    file: str | None  # its source file, absolute (None when it cannot be found)
    convention: str = "trl"
    kwargs: dict = field(default_factory=dict)
    weight: float = 1.0

    @property
    def builtin(self) -> bool:
        return self.target == BUILTIN

    @property
    def label(self) -> str:
        """How messages name it: 'file.py:name' or 'package.module:name'."""
        return self.target


def split_target(target: str) -> tuple[str | None, str | None, str] | str:
    """(file, module, name) of a target string, or why it is not one: 'path/file.py:name', 'package.module:name'
    or Hydra's 'package.module.name'."""
    if not isinstance(target, str) or not target.strip():
        return "is empty"
    text = target.strip()
    if ":" in text:
        where, _, name = text.rpartition(":")
    elif text.endswith(".py"):
        return "names a file but not the function in it"
    else:
        where, _, name = text.rpartition(".")
    if not name.isidentifier():
        return f"{name!r} is not a Python function name"
    if not where:
        return "names no file or module"
    if where.endswith(".py") or "/" in where or os.sep in where:
        return (where, None, name)
    if not all(part.isidentifier() for part in where.split(".")):
        return f"{where!r} is neither a .py file nor a dotted module name"
    return (None, where, name)


def _module_file(module: str) -> str | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None
    return spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def fn_refs(reward: Mapping[str, Any]) -> list[FnRef] | list[Problem]:
    """The main function and the components of a plan's `reward` config (a dict), or the problems of their
    targets (syntax, a file or module that does not exist)."""
    specs = [("main", "reward._target_", reward.get("_target_") or BUILTIN, reward.get("convention", "trl"), reward.get("kwargs") or {}, 1.0)]
    problems = []
    for name, comp in sorted((reward.get("components") or {}).items()):
        where = f"reward.components.{name}"
        if not isinstance(comp, Mapping) or not comp.get("_target_"):
            problems.append(Problem(where, comp, "a component is a mapping with at least _target_",
                                    f"write '+{where}={{_target_: file.py:function, weight: 0.1}}'"))
            continue
        extra = sorted(set(comp) - set(COMPONENT_KEYS))
        weight = comp.get("weight", 1.0)
        convention = getattr(comp.get("convention", "trl"), "value", comp.get("convention", "trl"))
        if extra:
            problems.append(Problem(f"{where}.{extra[0]}", comp[extra[0]], f"is not a key of a component "
                                    f"({', '.join(COMPONENT_KEYS)})", "drop it, or fix its spelling"))
        elif isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            problems.append(Problem(f"{where}.weight", weight, "is not a finite number", "give a float, e.g. 0.1"))
        elif convention not in CONVENTIONS:
            problems.append(Problem(f"{where}.convention", convention, f"is not one of {', '.join(CONVENTIONS)}",
                                    "use trl (TRL's reward_funcs signature), verl or easyr1"))
        elif not isinstance(comp.get("kwargs") or {}, Mapping):
            problems.append(Problem(f"{where}.kwargs", comp.get("kwargs"), "is not a mapping", "give {name: value, ...}"))
        else:
            specs.append((name, f"{where}._target_", comp["_target_"], convention, comp.get("kwargs") or {},
                          float(weight)))
    refs = []
    for role, fld, target, convention, kwargs, weight in specs:
        convention = getattr(convention, "value", convention)
        parts = split_target(target)
        if isinstance(parts, str):
            problems.append(Problem(fld, target, parts, "write 'path/to/file.py:function' or 'package.module:function'"))
            continue
        file, module, name = parts
        if file is not None:
            path = Path(file).expanduser()
            if not path.is_file():
                problems.append(Problem(fld, target, f"the file {path.resolve()} does not exist (a relative path is read "
                                        f"from the directory you run in: {os.getcwd()})",
                                        "give the path of your reward file, relative to here or absolute"))
                continue
            file = str(path.resolve())
        else:
            file = _module_file(module)
            if file is None:
                problems.append(Problem(fld, target, f"module {module!r} cannot be found on the Python path",
                                        "give a file path (path/to/file.py:function) or install the module"))
                continue
        refs.append(FnRef(role=role, field=fld, target=target, name=name, module=module, file=file,
                          convention=convention, kwargs=dict(kwargs), weight=weight))
    return problems or refs


# --- plan time: the signature read from the source, without importing it


def ast_params(file: str, name: str, allow_async: bool = False) -> list[tuple[str, str, bool]] | str | None:
    """The parameters (name, inspect kind, has a default) of the top-level function `name` in `file`; None when
    `name` is bound otherwise (an assignment, an import, a class: checked when the run loads it); a string saying
    why it cannot be a reward function (no such name, a syntax error, an async def where the convention awaits
    none: verl's does)."""
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"), filename=file)
    except SyntaxError as exc:
        return f"{file} does not parse: {exc.msg} (line {exc.lineno})"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{file} cannot be read: {exc}"
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                found = node
    if found is None:
        defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        return f"{file} defines no top-level {name!r}" + (f" (its functions: {', '.join(defs)})" if defs else "")
    if isinstance(found, ast.AsyncFunctionDef) and not allow_async:
        return f"{name} is an async function; a reward function of this convention returns its rewards"
    if not isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = found.args
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)  # defaults belong to the last positional parameters
    params = [(p.arg, "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD", i >= first_default)
              for i, p in enumerate(positional)]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", True))
    params += [(p.arg, "KEYWORD_ONLY", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", True))
    return params


def reward_problems(reward: Mapping[str, Any]) -> list[Problem]:
    """Every reason the reward config cannot be called (torch-free, imports nothing of the user's)."""
    refs = fn_refs(reward)
    if refs and isinstance(refs[0], Problem):
        return list(refs)
    problems = []
    main = refs[0]
    names = [main.name if not main.builtin else None] + [r.role for r in refs[1:]]
    if len([n for n in names if n]) != len({n for n in names if n}):
        problems.append(Problem("reward.components", sorted(r.role for r in refs[1:]),
                                f"a component is named like the main function {main.name!r}: the trace's components "
                                "would collide", "rename the component"))
    if main.builtin and reward.get("kwargs"):
        problems.append(Problem("reward.kwargs", reward.get("kwargs"), "is passed to reward._target_, and the built-in "
                                "reward takes none (its weights are reward.correct, format_weight, invalid_penalty)",
                                "drop reward.kwargs, or set reward._target_ to your function"))
    if not main.builtin:
        weights = {k: reward.get(k) for k in ("correct", "format_weight", "invalid_penalty")}
        changed = {k: v for k, v in weights.items() if v != {"correct": 1.0, "format_weight": 0.0, "invalid_penalty": 0.5}[k]}
        for k, v in changed.items():
            problems.append(Problem(f"reward.{k}", v, f"weighs a term of the built-in reward, which reward._target_="
                                    f"{main.target} replaces: it would change nothing",
                                    f"drop reward.{k}, or add the term to your function or as a reward.components entry"))
    from harness.rewards.conventions import kwargs_problem, signature_problem

    for ref in refs:
        kw_field = ref.field.replace("._target_", ".kwargs").replace("reward._target_", "reward.kwargs")
        why = kwargs_problem(ref.kwargs)
        if why:
            problems.append(Problem(kw_field, ref.kwargs, why, "rename the argument in your function and here"))
        if ref.builtin:
            continue
        params = ast_params(ref.file, ref.name, allow_async=ref.convention == "verl")
        if isinstance(params, str):
            problems.append(Problem(ref.field, ref.target, params, "name a top-level function of that file"))
            continue
        if params is not None:
            why = signature_problem(params, ref.convention, kwargs=list(ref.kwargs))
            if why:
                problems.append(Problem(ref.field, ref.target, why,
                                        "change the function's parameters, or set the convention it is written for "
                                        "(reward.convention=trl|verl|easyr1)"))
    return problems


# --- run time


def _user_traceback(exc: BaseException) -> str:
    """The traceback of the user's code: the frames of this module and of harness.rewards.conventions dropped."""
    ours = (__file__, str(Path(__file__).with_name("conventions.py")))
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def load(ref: FnRef) -> Callable:
    """Import the function (a file is loaded as its own module, its folder put on sys.path for its imports)."""
    try:
        if ref.module is not None:
            mod = importlib.import_module(ref.module)
        else:
            folder = str(Path(ref.file).parent)
            if folder not in sys.path:  # its own imports (a helpers.py next to it); appended: an EasyR1 `math.py`
                sys.path.append(folder)  # must not shadow the standard library's math
            digest = hashlib.sha256(ref.file.encode()).hexdigest()[:10]
            modname = f"_harness_reward_{Path(ref.file).stem}_{digest}"
            mod = sys.modules.get(modname)
            if mod is None:
                spec = importlib.util.spec_from_file_location(modname, ref.file)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[modname] = mod
                try:
                    spec.loader.exec_module(mod)
                except BaseException:
                    sys.modules.pop(modname, None)
                    raise
    except Exception as exc:  # noqa: BLE001  (the user's import error, with its traceback)
        raise RewardFunctionError(f"RewardFunctionError: {ref.field}={ref.target}: importing it failed:\n"
                                  f"{_user_traceback(exc)}\n    fix: make the file import on its own "
                                  f"(python -c 'import runpy; runpy.run_path(\"{ref.file}\")')") from None
    fn = getattr(mod, ref.name, None)
    if not callable(fn):
        raise RewardFunctionError(f"RewardFunctionError: {ref.field}={ref.target}: {ref.name!r} is "
                                  f"{'missing' if fn is None else 'not callable'} after importing {ref.file}\n"
                                  "    fix: name a function defined at the top level of that file")
    return fn


def _finite(ref: FnRef, values: list[float], keys: Sequence[str]) -> list[float]:
    """The adapter's floats (harness.rewards.conventions checked one number per completion), refused when one is NaN or
    inf, naming the function and the completion."""
    for i, x in enumerate(values):
        if not math.isfinite(x):
            raise RewardFunctionError(
                f"RewardFunctionError: {ref.field}={ref.target} returned {x} for completion {i} of the call (view "
                f"{keys[i]})\n    fix: return finite rewards: a NaN or inf would poison the group's advantages")
    return values


class Rewards:
    """The configured reward functions, loaded: `score(...)` gives one ScoreTrace per completion whose `total` and
    `components` are the reward's, and `parsed`/`prediction`/`gold`/`parser_error` the answer schema's reading."""

    def __init__(self, reward: Mapping[str, Any], data_source: str = ""):
        from harness.rewards.builtin import reward_config

        refs = fn_refs(reward)
        if refs and isinstance(refs[0], Problem):
            raise RewardFunctionError("RewardFunctionError: " + "; ".join(f"{p.field}={p.value}: {p.why}" for p in refs))
        self.weights = reward_config(reward)
        self.threshold = float(reward.get("success_threshold", 1.0))
        self.data_source = data_source
        self.refs: list[FnRef] = list(refs)
        self.main = self.refs[0]
        self._fns = [None if r.builtin else self._adapted(r) for r in self.refs]

    @classmethod
    def builtin(cls, weights) -> "Rewards":
        """The built-in reward with these weights (anything with correct, format_weight, invalid_penalty)."""
        return cls({"_target_": BUILTIN, "correct": weights.correct, "format_weight": weights.format_weight,
                    "invalid_penalty": weights.invalid_penalty})

    @staticmethod
    def _adapted(ref: FnRef) -> Callable:
        from harness.rewards.conventions import adapt, declared_reward_type

        reward_type = None
        if ref.convention == "easyr1":  # EasyR1 reads REWARD_TYPE from the file it loads, not from the function's module
            reward_type = declared_reward_type(Path(ref.file).read_text(encoding="utf-8"))
        return adapt(load(ref), ref.convention, ref.label, reward_type=reward_type)

    def columns(self, records: Sequence[Mapping[str, Any]], truncated: Sequence[bool]) -> dict[str, list]:
        """The dataset columns every reward function receives (one entry per completion)."""
        return {
            "target": [r["target"] for r in records],
            "answer_type": [r["answer_type"] for r in records],
            "relation": [r["relation"] for r in records],
            "question": [r.get("question") for r in records],
            "key": [r["key"] for r in records],
            "choices": [r.get("choices") for r in records],
            "meta": [r.get("meta") for r in records],
            "truncated": list(truncated),
            "data_source": [str((r.get("meta") or {}).get("data_source") or self.data_source) for r in records],
        }

    def _call(self, i: int, prompts, completions, completion_ids, columns: dict, trainer_state, n: int,
              keys: Sequence[str]) -> list[float]:
        from harness.rewards.conventions import RewardResultError

        ref = self.refs[i]
        try:
            result = self._fns[i](prompts=prompts, completions=completions, completion_ids=completion_ids,
                                  trainer_state=trainer_state, **columns, **ref.kwargs)
        except RewardResultError as exc:  # the convention's reading of the result failed: no traceback of ours
            said = str(exc).removeprefix(f"reward function {ref.label} ({ref.convention} convention) ")
            raise RewardFunctionError(f"RewardFunctionError: {ref.field}={ref.target} ({ref.convention} convention) "
                                      f"{said}\n    fix: return what that convention reads, or set the one the "
                                      "function is written for (reward.convention=trl|verl|easyr1)") from None
        except Exception as exc:  # noqa: BLE001  (the user's own error: its traceback once, the run failed)
            raise RewardFunctionError(
                f"RewardFunctionError: {ref.field}={ref.target} raised {type(exc).__name__} scoring {n} completions "
                f"(views {', '.join(keys[:3])}{', ...' if n > 3 else ''}):\n{_user_traceback(exc)}\n"
                "    fix: when the failure was passing (a service, a file), the same command resumes the run from its last "
                "checkpoint; when the function needs a fix, the same command trains the edited reward as a new run "
                "(the run name carries the reward's code digest) and leaves this one as it is") from None
        return _finite(ref, result, keys)

    def score(self, prompts, completions, completion_ids, records: Sequence[Mapping[str, Any]],
              truncated: Sequence[bool], trainer_state=None) -> list:
        """One ScoreTrace per completion: the reward (total, components, correct) and the answer schema's reading.
        Every function is called before anything is returned: a failing call leaves nothing half-scored."""
        from harness.rewards.builtin import completion_text, score

        n = len(completions)
        traces = [score(completion_text(c), r, truncated=t, cfg=self.weights)
                  for c, r, t in zip(completions, records, truncated)]
        keys = [str(r.get("key", i)) for i, r in enumerate(records)]
        if len(self.refs) == 1 and self.main.builtin:
            return traces  # the built-in alone: exactly harness.rewards.score
        columns = self.columns(records, truncated)
        if self.main.builtin:
            comps = [dict(t.components) for t in traces]
            main = [t.total for t in traces]
        else:
            main = self._call(0, prompts, completions, completion_ids, columns, trainer_state, n, keys)
            comps = [{self.main.name: v} for v in main]
        for i, ref in enumerate(self.refs[1:], start=1):
            vals = self._call(i, prompts, completions, completion_ids, columns, trainer_state, n, keys)
            for c, v in zip(comps, vals):
                c[ref.role] = ref.weight * v
        out = []
        for t, c, m in zip(traces, comps, main):
            correct = t.correct if self.main.builtin else m >= self.threshold
            out.append(replace(t, components=c, total=sum(c.values()), correct=correct))
        return out
