"""Strict overrides: every key on the command line must be a key of the schema, whatever its prefix.

Hydra refuses `arm.lamda_direction=0.5` (a key the schema lacks) but accepts `+arm.lamda_direction=0.5`
and `++arm.lamda_direction=0.5`: it adds the key, the schema ignores it, and the default run goes ahead.
Here such a key is an error at compose time, with the closest valid key as the fix; Hydra's own compose
errors (a wrong key, type, enum value or group option) are rewritten in the house form of
harness.errors.Problem (`field = value: why` / `fix:`) so that they exit 2 like every other ConfigError.

    check_composed(cfg, overrides)   after a compose: the keys of the overrides against the composed types
    explain_compose_error(exc, ...)  a Hydra/OmegaConf compose exception -> ConfigError
    check_static(overrides)          before a multirun (no compose yet): what Hydra could not compose at all

Torch-free, like compose and plan.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import typing
from functools import lru_cache
from typing import Any, Iterable, Optional

from harness.config import schema
from harness.config.paths import CONF_DIR, SWEEPS_DIR
from harness.config.store import is_derived_option
from harness.errors import ConfigError, Problem

HELP = "python -m harness --help lists every key"
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


# --- parsing


def parse(overrides: Iterable[str]) -> tuple[list, list[Problem]]:
    """(Hydra Override objects, a Problem for each override that does not parse)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed, problems = [], []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            problems.append(Problem("override", text, f"does not parse: {_first_line(exc.message)}",
                                    f"write key=value (quote values with spaces or special characters); see {GRAMMAR}"))
    return parsed, problems


def _raw_value(ov) -> str | None:
    """The value as typed on the command line (None for a deletion without a value)."""
    line = ov.input_line or ""
    return line.split("=", 1)[1] if "=" in line else None


def is_hydra_key(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


# --- config groups


@lru_cache(maxsize=1)
def _conf_groups() -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for path in CONF_DIR.rglob("*.yaml"):
        group = path.parent.relative_to(CONF_DIR).as_posix()
        if group != "." and not is_hydra_key(group):
            found.setdefault(group, set()).add(path.stem)
    return {g: frozenset(opts) for g, opts in found.items()}


def groups() -> dict[str, tuple[str, ...]]:
    """Config group -> its options: conf/<group>/*.yaml and the ConfigStore (schema/*, sweep). No hydra/* groups."""
    from hydra.core.config_store import ConfigStore

    if "schema" not in ConfigStore.instance().repo:  # used before anything composed (the CLI registers lazily)
        from harness.config.store import register

        register(with_help=False)
    found: dict[str, set[str]] = {g: set(opts) for g, opts in _conf_groups().items()}

    def walk(node: dict, prefix: str) -> None:
        for name, value in node.items():
            if isinstance(value, dict):
                group = prefix + name
                if not is_hydra_key(group):
                    found.setdefault(group, set()).update(  # not the warm-start variants the plan stores
                        n[:-5] for n, v in value.items()
                        if not isinstance(v, dict) and n.endswith(".yaml") and not is_derived_option(n))
                walk(value, group + "/")

    walk(ConfigStore.instance().repo, "")
    return {g: tuple(sorted(opts)) for g, opts in sorted(found.items())}


def _is_group(ov) -> bool:
    return ov.key_or_group in groups()


# --- the schema walk


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return {k: _strip_optional(v) for k, v in typing.get_type_hints(cls).items()
            if k in {f.name for f in dataclasses.fields(cls)}}


def _child_node(node, key: str):
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return None
    try:
        return node._get_node(key, throw_on_missing_key=False)
    except Exception:  # noqa: BLE001  (an interpolation or a missing value: walk by the schema alone)
        return None


def _node_type(node, declared: type) -> type:
    """The composed node's structured type when it refines the declared one (arm: ArmConfig -> EviPoArm)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
        tp = OmegaConf.get_type(node)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and issubclass(tp, declared):
            return tp
    return declared


def _group_classes(group: str) -> list[type]:
    return list(dict.fromkeys(schema.SCHEMAS[group].values()))


def _candidates(classes: list[type], prefix: str) -> list[str]:
    """Every valid dotted key under `prefix` (the root also offers the group names)."""
    out: list[str] = []
    for cls in classes:
        out += [p for p, _ in schema.iter_fields(cls, prefix)]
    if prefix == "":
        out += [g for g in groups() if "/" not in g]
    return list(dict.fromkeys(out))


def suggest(key: str, candidates: Iterable[str], prefix: str = "") -> Optional[str]:
    """The candidate closest to `key` (difflib), compared below their common `prefix` ("arm.": the part after it)."""
    rest = {c[len(prefix):]: c for c in candidates if c.startswith(prefix)}
    best = difflib.get_close_matches(key[len(prefix):], list(rest), n=1, cutoff=0.6)
    return rest[best[0]] if best else None


def _elsewhere(key: str, group: str, classes: list[type]) -> Optional[str]:
    """`arm.lambda_direction is a key of arm=evi_po only`: the key (or its closest) in another option's schema."""
    others = {name: c for name, c in schema.SCHEMAS.get(group, {}).items() if c not in classes}
    best = suggest(key, _candidates(list(others.values()), group + "."), group + ".")
    if best is None:
        return None
    first = best[len(group) + 1:].split(".")[0]
    owners = [name for name, c in others.items() if first in _hints(c)]
    return (f"{best} is a key of {' / '.join(f'{group}={o}' for o in owners)} only: choose that option "
            f"(e.g. {group}={owners[0]}) or drop the override")


def key_problem(key: str, value: Any, classes: list[type] | None = None, prefix: str = "", node=None,
                how: str = "") -> Optional[Problem]:
    """A Problem when the dotted `key` is not a key of the schema, else None.

    `prefix` (empty, or ending in ".") is the part of `key` already known to be a node of one of `classes`
    (default: the root schema). `node` is the composed config at `prefix`: its types pick the chosen group
    option (arm is an ArmConfig at the root, an EviPoArm once arm=evi_po is composed). Without a node, a
    group's key is valid when any option of the group has it. Keys under a list, dict or Any field are not
    checked (the schema says nothing about them).
    """
    assert key.startswith(prefix), (key, prefix)
    classes = list(classes or [schema.Config])
    segs = key[len(prefix):].split(".")
    for i, seg in enumerate(segs):
        here = prefix + "".join(s + "." for s in segs[:i])  # "" or "arm." or "model.tiny."
        hits = [c for c in classes if seg in _hints(c)]
        if not hits:
            where = here[:-1] or "the config"
            names = "/".join(dict.fromkeys(c.__name__ for c in classes))
            best = suggest(key, _candidates(classes, here), here)
            if best is None and here == "" and "." in key:  # a group key with the group misspelled
                best = suggest(key, [g + "." + p for g in schema.SCHEMAS for c in _group_classes(g)
                                     for p, _ in schema.iter_fields(c)])
            other = _elsewhere(key, here[:-1], classes) if best is None and here.count(".") == 1 else None
            fix = (f"did you mean {best}? ({HELP})" if best else other or f"use a key of {where} ({HELP})")
            return Problem(key, value, f"{where} ({names}) has no key {seg!r}{how}", fix)
        last = i + 1 == len(segs)
        child = _child_node(node, seg)
        nxt: list[type] = []
        for cls in hits:
            tp = _hints(cls)[seg]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                if node is None and here == "" and seg in schema.SCHEMAS:
                    nxt += _group_classes(seg)  # nothing composed yet: any option of the group
                else:
                    nxt.append(_node_type(child, tp))
            elif not _is_scalar(tp) or last:
                return None  # a leaf, or the inside of a list, dict or Any field: free-form
        if last:
            return None
        if not nxt:  # every candidate has a scalar here, and the key goes on below it
            full = here + seg
            return Problem(key, value, f"{full} is {_type_name(_hints(hits[0])[seg])} value: it has no keys",
                           f"set {full}=... itself ({HELP})")
        classes, node = list(dict.fromkeys(nxt)), child
    return None


def _is_scalar(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, (int, float, str, bool, enum.Enum))


def _type_name(tp: Any) -> str:
    """'a float', 'an int', 'a Tuning'."""
    name = getattr(_strip_optional(tp), "__name__", str(tp))
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


_HOW = {"ADD": "; `+` cannot add a key the schema does not have",
        "FORCE_ADD": "; `++` cannot add a key the schema does not have"}


def _how(ov) -> str:
    return _HOW.get(ov.type.name, "")


# --- after a compose


def check_composed(cfg, overrides: Iterable[str] | None) -> list[Problem]:
    """The overrides' keys checked against the composed config's schema types (`+`, `++` and plain alike).

    Group selections (arm=evi_po), deletions (~key), packaged overrides (key@pkg=...) and hydra.* are not keys
    of the job's schema and are left alone (Hydra has already checked them).
    """
    parsed, problems = parse(overrides or [])
    for ov in parsed:
        key = ov.key_or_group
        if is_hydra_key(key) or _is_group(ov) or ov.is_delete() or ov.package is not None:
            continue
        p = key_problem(key, _raw_value(ov), node=cfg, how=_how(ov))
        if p is not None:
            problems.append(p)
    return problems


def strict_check(cfg, overrides: Iterable[str] | None) -> None:
    """Raise a ConfigError naming every override key the composed schema does not have."""
    problems = check_composed(cfg, overrides)
    if problems:
        raise ConfigError(problems)


# --- before a compose (a multirun: Hydra composes each job later, inside its launcher)


def group_problems(ov) -> list[Problem]:
    """group=option (or a sweep of options) naming an option the group does not have."""
    group, opts = ov.key_or_group, groups().get(ov.key_or_group, ())
    if ov.is_delete():
        return []
    if not ov.is_sweep_override() and ov.value() is None:
        return [Problem(group, None, "a config group takes an option name, not null",
                        f"leave {group} out for its default, or drop it with ~{group}")]
    try:
        if ov.is_sweep_override():
            values = list(ov.sweep_string_iterator())
        elif isinstance(ov.value(), list):  # several options of one group (logger=[tensorboard,wandb])
            values = [str(v) for v in ov.value()]
        else:
            values = [ov.get_value_element_as_str()]
    except Exception:  # noqa: BLE001  (a glob or an interpolation: Hydra resolves it)
        return []
    return [_option_problem(group, v, opts) for v in values if v not in opts]


def _option_problem(group: str, option: str, options: Iterable[str]) -> Problem:
    options = list(options)
    best = difflib.get_close_matches(option, options, n=1, cutoff=0.5)
    listing = ", ".join(options) or "none"
    fix = f"did you mean {group}={best[0]}? (options: {listing})" if best else f"use one of: {listing}"
    return Problem(group, option, f"is not an option of the config group {group} (conf/{group}/)", fix)


@lru_cache(maxsize=1)
def _default_options() -> dict[str, str]:
    """group -> option in conf/config.yaml's defaults list (arm: grpo)."""
    from omegaconf import OmegaConf

    out = {}
    for entry in OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml")).get("defaults", []):
        if isinstance(entry, dict):
            out.update({k: v for k, v in entry.items() if isinstance(v, str) and not k.startswith("override")})
    return out


def _has_defaults(ov) -> bool:
    """Whether a selected option (debug=tiny, sweep=<name>) has a defaults list (it could override a group)."""
    try:
        options = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
    except Exception:  # noqa: BLE001
        return True
    from omegaconf import OmegaConf

    for option in options:
        path = (SWEEPS_DIR if ov.key_or_group == "sweep" else CONF_DIR / ov.key_or_group) / f"{option}.yaml"
        if path.is_file() and "defaults" in OmegaConf.load(path):
            return True
    return False


def check_static(overrides: Iterable[str]) -> list[Problem]:
    """What Hydra could not compose in a multirun: parse errors, unknown group options, and plain keys that
    no option of their group has, or that an option chosen on the command line (arm=grpo,evi_po) lacks.
    `+`/`++` keys compose and are refused per job (a failed job of the sweep, recorded like any other)."""
    parsed, problems = parse(overrides)
    # group -> [(option, where)]: the options a plain key of the group must exist in (the last override wins)
    chosen: dict[str, list[tuple[str, str]]] = {}
    # an option with a defaults list (sweeps/*.yaml: `override /arm: evi_po`) may change the default options
    moved = any(_has_defaults(ov) for ov in parsed if _is_group(ov) and ov.key_or_group not in schema.SCHEMAS)
    for ov in parsed:
        group = ov.key_or_group
        if group not in schema.SCHEMAS or not _is_group(ov) or ov.package is not None or ov.is_delete():
            continue
        try:
            options = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        except Exception:  # noqa: BLE001  (a glob or an interpolation: no narrowing)
            chosen.pop(group, None)
            continue
        chosen[group] = [(o, f"in the jobs with {group}={o}") for o in options]
        default = _default_options().get(group)
        if ov.is_sweep_override() and default and not moved:
            # hydra.main composes a multirun once without its sweeps (so with the default option) before any job
            chosen[group].insert(0, (default, f"Hydra composes a multirun once with the default {group}={default} "
                                              "before its jobs (a swept group takes its default there)"))
    for group, default in ({} if moved else _default_options()).items():
        if group in schema.SCHEMAS and group not in chosen:
            chosen[group] = [(default, f"with the default {group}={default}")]
    for ov in parsed:
        key = ov.key_or_group
        if is_hydra_key(key) or ov.package is not None:
            continue
        if _is_group(ov):
            problems += group_problems(ov)
        elif not (ov.is_add() or ov.is_force_add() or ov.is_delete()):
            p = key_problem(key, _raw_value(ov))
            group = key.split(".")[0]
            for option, where in chosen.get(group, []) if p is None and "." in key else []:
                cls = schema.SCHEMAS[group].get(option)
                q = key_problem(key, _raw_value(ov), [cls], group + ".") if cls is not None else None
                if q is not None:
                    fix = q.fix
                    if where.startswith("Hydra"):
                        fix = f"write ++{ov.input_line}: it composes there, and each job checks the key again"
                    p = Problem(q.field, q.value, f"{where}: {q.why}", fix)
                    break
            if p is not None:
                problems.append(p)
    return problems


# --- a compose that failed


def _first_line(text: Any) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), str(text))


def _override_for(parsed: list, key: str):
    """The key override that sets `key`: the same key, else one above it (a dict value), else one below it."""
    keys = [ov for ov in parsed if not _is_group(ov) and not is_hydra_key(ov.key_or_group)]
    for match in (lambda k: k == key, lambda k: key.startswith(k + "."), lambda k: k.startswith(key + ".")):
        found = [ov for ov in keys if match(ov.key_or_group)]
        if found:
            return found[-1]  # the last one wins, as in Hydra
    return None


def _field_of(cls: Any, name: str):
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        for fld in dataclasses.fields(cls):
            if fld.name == name:
                return fld, _hints(cls).get(name)
    return None, None


def _value_problem(cause, parsed: list) -> Problem:
    """A wrong type or enum value (OmegaConf ValidationError) named by its field, with what it takes."""
    key = str(cause.full_key)
    ov = _override_for(parsed, key)
    value = _raw_value(ov) if ov is not None else None
    fld, tp = _field_of(getattr(cause, "object_type", None), key.rsplit(".", 1)[-1])
    if ov is not None and ov.key_or_group.startswith(key + ".") and tp is not None:  # arm.learning_rate.x=1
        return Problem(ov.key_or_group, value, f"{key} is {_type_name(tp)} value: it has no keys",
                       f"set {key}=... itself ({HELP})")
    why = _first_line(cause.msg if hasattr(cause, "msg") else cause)
    if fld is not None and fld.metadata.get("help"):
        why += f" ({fld.metadata['help']})"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        names = [m.value for m in tp]
        best = difflib.get_close_matches(str(value), names, n=1, cutoff=0.5) if value is not None else []
        fix = (f"did you mean {key}={best[0]}? " if best else "") + f"{key} takes one of: {', '.join(names)}"
    elif tp is not None:
        default = fld.default if fld is not None and fld.default is not dataclasses.MISSING else None
        example = f", e.g. {key}={default}" if isinstance(default, (int, float, str)) and default != "???" else ""
        fix = f"{key} takes {_type_name(tp)}{example}"
    else:
        fix = f"give {key} a value of its schema type ({HELP})"
    return Problem(key, value, why, fix)


def explain_compose_error(exc: BaseException, overrides: Iterable[str]) -> ConfigError:
    """A Hydra / OmegaConf compose exception as a ConfigError in the house form (exit 2)."""
    overrides = list(overrides)
    try:
        return _explain(exc, overrides)
    except Exception:  # noqa: BLE001  (explaining must never hide the error behind a traceback of its own)
        return ConfigError([_generic(exc, [])])


def _explain(exc: BaseException, overrides: list[str]) -> ConfigError:
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    parsed, problems = parse(overrides)
    if problems:  # Hydra stops at the first override that does not parse; list them all
        return ConfigError(problems)
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    found: Optional[Problem] = None
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and "/" in exc.missing_cfg_file:
        group, option = exc.missing_cfg_file.rsplit("/", 1)
        options = [o for o in exc.options or groups().get(group, ()) if not is_derived_option(o)]
        found = _option_problem(group, option, options)
    elif isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
        full = str(cause.full_key)
        ov = _override_for(parsed, full)
        parent = full.rsplit(".", 1)[0] + "." if "." in full else ""
        obj = getattr(cause, "object_type", None)
        classes = [obj] if isinstance(obj, type) and dataclasses.is_dataclass(obj) else None
        key = ov.key_or_group if ov is not None and ov.key_or_group.startswith(full) else full
        if classes is not None or parent == "":
            found = key_problem(key, _raw_value(ov) if ov is not None else None, classes, parent)
    elif isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        found = _value_problem(cause, parsed)
    elif isinstance(exc, OverrideParseException):
        found = Problem("override", getattr(exc, "override", None), _first_line(exc.message), f"see {GRAMMAR}")
    # Problems Hydra did not get to: other unknown group options and unknown top-level keys.
    for ov in parsed:
        key = ov.key_or_group
        if is_hydra_key(key) or ov.package is not None or ov.is_delete():
            continue
        if _is_group(ov):
            problems += group_problems(ov)
        elif "." not in key:
            p = key_problem(key, _raw_value(ov), how=_how(ov))
            if p is not None:
                problems.append(p)
    if found is None:
        if problems:  # e.g. group=null: Hydra's ValueError says less than the problem found here
            return ConfigError(list(dict.fromkeys(problems)))
        found = _generic(exc, parsed)
    problems = [found] + [p for p in problems if (p.field, p.value) != (found.field, found.value)]
    return ConfigError(list(dict.fromkeys(problems)))


def _generic(exc: BaseException, parsed: list) -> Problem:
    """Any other compose error: Hydra's first line as the why, its advice (if any) as the fix."""
    text = str(exc)
    if exc.__cause__ is not None and str(exc.__cause__).strip() not in text:
        text += "\n" + str(exc.__cause__)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("provider=", "Config search path", "full_key:",
                                                      "reference_type=", "object_type="))]
    culprit = next((ov for ov in parsed if (ov.input_line or "") in text or f"'{ov.key_or_group}'" in text), None)
    field = culprit.key_or_group if culprit is not None else "config"
    value = _raw_value(culprit) if culprit is not None else None
    advice = "; ".join(lines[1:4])
    return Problem(field, value, lines[0] if lines else type(exc).__name__, advice or f"see {GRAMMAR} ({HELP})")
