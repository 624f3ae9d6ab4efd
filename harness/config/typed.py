"""The typed Config of a plan, rebuilt from its JSON: what every rank and every stage reads (`Plan.cfg`).

A plan travels as JSON (the plan file of a multi-process launch, the run manifest), where enums are strings and
the arm and data groups are plain dicts. `from_json(Config, plan.config)` gives back the schema's dataclasses:
the arm's own config class from the registry (arms/<name>/config.py, by `arm.name`), the data option's schema
class (the one the dict fills best), enums as enums. It is the inverse of
`harness.identity.to_jsonable` on the plan's config (`to_jsonable(from_json(Config, d)) == d`, tested), so a
field is read as `plan.cfg.train.eval_steps`: an editor follows it to its declaration (help, bounds, flags),
a type checker or linter flags a misspelled one, and a misspelled one that runs fails with an AttributeError
that names it, not with a KeyError inside a nested dict.

Torch-free, no OmegaConf (a plain walk of the dataclass fields: about a millisecond per plan).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from enum import Enum
from typing import Any

from harness.config.fields import ArmConfig
from harness.config.schema import SCHEMAS, DataConfig


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _data_class(value: dict) -> type:
    """The data group's schema class of a data dict: the one it fills best (its keys matched, fewest left out)."""
    keys = set(value)

    def fit(cls: type) -> int:
        names = {f.name for f in dataclasses.fields(cls)}
        return len(keys & names) - len(names - keys)

    return max(SCHEMAS["data"].values(), key=fit)


def _concrete(tp: Any, value: Any) -> Any:
    """The class a value of the annotated type `tp` is built as (Optional[X] -> X, the arm's and data's own)."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else Any
    if tp is ArmConfig and isinstance(value, dict):
        from arms import registry

        return registry()[value["name"]].config
    if isinstance(value, dict) and tp is DataConfig:
        return _data_class(value)
    return tp


def from_json(tp: Any, value: Any) -> Any:
    """`value` (plain JSON types) as an instance of the annotated type `tp` (a schema dataclass, an enum, ...)."""
    if value is None:
        return None
    cls = _concrete(tp, value)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        hints = _hints(cls)
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        # a plan of an older harness may lack a field added since (it takes the field's default, what that plan
        # ran with) or hold one removed since (no code reads it any more): both still read
        return cls(**{k: from_json(hints[k], v) for k, v in value.items() if k in names})
    if isinstance(cls, type) and issubclass(cls, Enum):
        return cls(value)
    return value
