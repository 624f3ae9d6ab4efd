"""The porting engine: a source recipe (schema defaults + CONFIG.yaml + its overrides) -> classified fields ->
harness overrides -> composed and planned in-process. Torch-free (yaml, omegaconf, the harness's control plane).

    load_source(source, config, overrides)   every leaf of the effective source config, with its origin
    classify(...)                            one Entry per leaf, by the first rule of the source's table
                                             (harness.port.verl / harness.port.easyr1) that matches it
    port(...)                                the whole thing: a PortResult (entries, overrides, problems)

A rule is (glob over the dotted field, handler). `*` matches inside one segment, `**` across segments. A handler
gets the Field and the Ctx and returns (class, harness key or None, note); it sets harness overrides with
ctx.set and refuses with ctx.refuse (a Problem: the port exits 2).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from harness.errors import Problem

CLASSES = ("exact", "semantically_conformant", "locally_lowered", "informational_only", "distributed_only",
           "not_implemented", "unsupported")
SCHEMA_DIR = Path(__file__).with_name("schemas")
MISSING = "???"


@dataclass(frozen=True)
class Field:
    path: str
    value: Any
    default: Any
    origin: str  # default | config | override

    @property
    def is_default(self) -> bool:
        return self.value == self.default

    @property
    def set(self) -> bool:
        return self.origin != "default"


@dataclass
class Entry:
    field: str
    value: Any
    cls: str
    harness: Optional[str]
    note: str
    origin: str

    def to_json(self) -> dict:
        return {"field": self.field, "value": self.value, "class": self.cls, "harness": self.harness,
                "note": self.note, "origin": self.origin}


# --- the source: schema, recipe file, overrides


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value for every leaf; an empty mapping is a leaf (a free-form node of the schema)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def _load_yaml(path: Path, what: str, problems: list[Problem]) -> Optional[dict]:
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except OSError as exc:
        problems.append(Problem(what, str(path), f"cannot be read: {exc.strerror or exc}", "pass the recipe's YAML file"))
        return None
    except Exception as exc:  # noqa: BLE001  (a YAML syntax error: its first line says where)
        problems.append(Problem(what, str(path), f"is not valid YAML: {str(exc).splitlines()[0]}",
                                "fix the file (python -c 'import yaml,sys; yaml.safe_load(open(sys.argv[1]))' FILE)"))
        return None
    return OmegaConf.to_container(cfg, resolve=False) if cfg is not None else {}


def _is_free(path: str, default: Any) -> bool:
    """A free-form node of the schema (kwargs, override dicts): any key below it is the source's to accept."""
    return default == {} or (default is None and path.rsplit(".", 1)[-1].endswith(("kwargs", "_config", "args")))


class Source:
    """The schema of one source framework (its defaults) and the recipe merged over it."""

    def __init__(self, name: str):
        self.name = name
        problems: list[Problem] = []
        self.schema = _load_yaml(SCHEMA_DIR / f"{name}.yaml", "schema", problems) or {}
        self.defaults = _leaves(self.schema)
        self.free = {p for p, v in self.defaults.items() if _is_free(p, v)}

    def owner(self, path: str) -> Optional[str]:
        """The schema leaf or free-form node that holds `path`, or None (an unknown field)."""
        if path in self.defaults:
            return path
        parts = path.split(".")
        for i in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:i])
            if head in self.free:
                return head
            if head in self.defaults:  # a scalar leaf of the schema with keys below it
                return None
        return None

    def unknown(self, path: str, value: Any, how: str) -> Problem:
        sections = {p.rsplit(".", 1)[0] for p in self.defaults if "." in p}
        if any(s == path or s.startswith(path + ".") for s in sections):
            return Problem(path, value, f"is a section of the {self.name} schema, not a value{how}",
                           f"set its fields ({path}.<field>=...)")
        best = difflib.get_close_matches(path, list(self.defaults), n=1, cutoff=0.6)
        if not best:  # compare the last segment inside the same section
            parent, _, leaf = path.rpartition(".")
            sibs = {p.rsplit(".", 1)[-1]: p for p in self.defaults if p.rpartition(".")[0] == parent}
            near = difflib.get_close_matches(leaf, list(sibs), n=1, cutoff=0.6)
            best = [sibs[near[0]]] if near else []
        fix = f"did you mean {best[0]}?" if best else f"use a field of the {self.name} schema (harness/port/schemas/{self.name}.yaml)"
        return Problem(path, value, f"{self.name} has no field {path!r}{how}", fix)


def parse_override(text: str) -> tuple[str, str, Any] | None:
    """(prefix, key, value) of `key=value` / `+key=value` / `++key=value`, the value parsed as YAML; None if no `=`."""
    import yaml

    if "=" not in text:
        return None
    key, raw = text.split("=", 1)
    prefix = key[: len(key) - len(key.lstrip("+~"))]
    key = key.lstrip("+~")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return prefix, key, value


def load_source(src: Source, config_path: Optional[str], overrides: list[str],
                problems: list[Problem]) -> dict[str, Field]:
    """Every leaf of schema defaults <- CONFIG.yaml <- overrides (in order), resolved; unknown keys are Problems."""
    from omegaconf import OmegaConf

    merged = OmegaConf.create(src.schema)
    origin: dict[str, str] = {}
    if config_path is not None:
        recipe = _load_yaml(Path(config_path), "CONFIG", problems)
        for path, value in _leaves(recipe or {}).items():
            if value == {} and path in src.defaults:
                continue
            if src.owner(path) is None:
                problems.append(src.unknown(path, value, f" (in {config_path})"))
                continue
            OmegaConf.update(merged, path, value, force_add=True, merge=False)
            origin[path] = "config"
    for text in overrides:
        parsed = parse_override(text)
        if parsed is None:
            problems.append(Problem("override", text, "is not KEY=VALUE",
                                    f"write it as the {src.name} launch script does: section.field=value"))
            continue
        prefix, key, value = parsed
        if "~" in prefix:
            problems.append(Problem(key, text, "deletes a field; the port reads every field of the schema",
                                    "drop the ~ override (set the field to its intended value instead)"))
            continue
        if src.name == "easyr1" and key == "config":
            problems.append(Problem("config", value, "is EasyR1's recipe file argument, not a field",
                                    "pass the file as CONFIG (python -m harness.port easyr1 FILE ...)"))
            continue
        if src.owner(key) is None:
            problems.append(src.unknown(key, value, f" (override {text!r})"))
            continue
        OmegaConf.update(merged, key, value, force_add=True, merge=False)
        for p in [p for p in origin if p == key or p.startswith(key + ".")]:
            del origin[p]
        origin[key] = "override"
    try:
        resolved = OmegaConf.to_container(merged, resolve=True, throw_on_missing=False)
    except Exception as exc:  # noqa: BLE001  (an interpolation of the recipe that does not resolve)
        problems.append(Problem(str(getattr(exc, "full_key", "CONFIG")), None,
                                f"does not resolve: {str(exc).splitlines()[0]}", "fix the interpolation in the recipe"))
        resolved = OmegaConf.to_container(merged, resolve=False)
    fields = {}
    for path, value in _leaves(resolved).items():
        owner = src.owner(path)
        how = next((o for p, o in origin.items() if path == p or path.startswith(p + ".")), "default")
        fields[path] = Field(path, value, src.defaults.get(path, src.defaults.get(owner or "", None)), how)
    return fields


# --- classification


@dataclass
class Ctx:
    """What a handler sees: every field of the source, the harness overrides so far, the problems."""

    source: str
    fields: dict[str, Field]
    replaced: set[str] = field(default_factory=set)  # harness groups the user chose with --harness (model, data)
    overrides: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # harness key -> source field that set it
    problems: list[Problem] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # derived once, read by several handlers

    def get(self, path: str, default: Any = None) -> Any:
        f = self.fields.get(path)
        return default if f is None else f.value

    def is_set(self, path: str) -> bool:
        f = self.fields.get(path)
        return f is not None and f.set

    def set(self, key: str, value: Any, by: str) -> None:
        self.overrides[key] = value
        self.origin[key] = by

    def refuse(self, f: Field, why: str, fix: str) -> None:
        self.problems.append(Problem(f.path, f.value, why, fix))


Handler = Callable[[Field, Ctx], tuple]
Rule = tuple[str, Handler]


def _glob(pattern: str) -> re.Pattern:
    out = ""
    for part in re.split(r"(\*\*|\*)", pattern):
        out += ".*" if part == "**" else "[^.]*" if part == "*" else re.escape(part)
    return re.compile(out + r"\Z")


def classify(fields: dict[str, Field], rules: list[Rule], ctx: Ctx) -> list[Entry]:
    compiled = [(_glob(p), h) for p, h in rules]
    entries = []
    for f in fields.values():
        handler = next((h for rx, h in compiled if rx.match(f.path)), None)
        if handler is None:  # a schema leaf no rule covers: a bug of the table, refused like an unknown field
            ctx.problems.append(Problem(f.path, f.value, "the port has no rule for this field",
                                        "report it: harness/port rules must cover every schema field"))
            continue
        cls, harness, note = handler(f, ctx)
        assert cls in CLASSES, (f.path, cls)
        entries.append(Entry(f.path, f.value, cls, harness, note, f.origin))
    return entries


# --- handlers shared by the rule tables


def info(note: str) -> Handler:
    return lambda f, ctx: ("informational_only", None, note)


def dist(note: str, harness: Optional[str] = None) -> Handler:
    return lambda f, ctx: ("distributed_only", harness, note)


def not_impl(note: str) -> Handler:
    return lambda f, ctx: ("not_implemented", None, note)


def mapped(cls: str, key: str, conv: Callable[[Any], Any] = lambda v: v, note: str = "", *,
           also: Optional[dict] = None) -> Handler:
    """Sets harness `key` to conv(value) (and the fixed overrides `also`), classified `cls`."""
    def h(f: Field, ctx: Ctx):
        ctx.set(key, conv(f.value), f.path)
        for k, v in (also or {}).items():
            ctx.set(k, v, f.path)
        return cls, key, note
    return h


def exact(key: str, conv: Callable[[Any], Any] = lambda v: v, note: str = "same meaning and units") -> Handler:
    return mapped("exact", key, conv, note)


def when(cond: Callable[[Field, Ctx], bool], then: Handler, otherwise: Handler) -> Handler:
    return lambda f, ctx: (then if cond(f, ctx) else otherwise)(f, ctx)


def unset_or(then: Handler, note: str = "unset") -> Handler:
    """informational while the value is null/empty/-1 (the source's 'off'), else `then`."""
    return when(lambda f, ctx: f.value in (None, {}, [], -1, ""), info(note), then)


def only(allowed: tuple, note: str, then: Optional[Handler] = None, cls: str = "exact") -> Handler:
    """Exact (or `then`) for the values the harness honours; any other value is unsupported and refused."""
    def h(f: Field, ctx: Ctx):
        if f.value in allowed:
            return then(f, ctx) if then else (cls, None, note)
        ctx.refuse(f, f"{ctx.source} value {f.value!r} cannot be honoured: {note}",
                   f"set it to {' or '.join(repr(a) for a in allowed)} (the harness's behaviour), or port another recipe")
        return "unsupported", None, note
    return h


def lacks(allowed: tuple, note: str) -> Handler:
    """A knob the harness lacks: `unsupported` whatever the value; the values equal to the harness's behaviour pass,
    any other is refused."""
    def h(f: Field, ctx: Ctx):
        if f.value in allowed:
            return "unsupported", None, f"{note}; this value is what the harness does (another would be refused)"
        ctx.refuse(f, f"{ctx.source} value {f.value!r} cannot be honoured: {note}",
                   f"set it to {' or '.join(repr(a) for a in allowed)} (the harness's behaviour), or port another recipe")
        return "unsupported", None, note
    return h


def inactive_unless(cond: Callable[[Ctx], bool], reason: str, then: Handler) -> Handler:
    """A knob that only acts with another field: informational (it changes nothing) while that one is off."""
    def h(f: Field, ctx: Ctx):
        if cond(ctx):
            return then(f, ctx)
        return "informational_only", None, f"inactive ({reason}): does not change training"
    return h


# --- the result


@dataclass
class PortResult:
    source: str
    entries: list[Entry]
    overrides: list[str]  # harness command-line overrides, in order
    problems: list[Problem]
    values: dict[str, Any]  # harness key -> value (the same overrides, typed), for the preset

    @property
    def runnable(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"source": self.source, "overrides": self.overrides, "fields": [e.to_json() for e in self.entries],
                "runnable": self.runnable,
                "problems": [{"field": p.field, "value": p.value, "why": p.why, "fix": p.fix} for p in self.problems]}
