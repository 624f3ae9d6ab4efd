"""The arm registry: every package arms/<name>/ whose __init__ defines `ARM = ArmSpec(...)` is an arm.

Adding an arm means adding that package (config, terms, trainer) and conf/arm/<name>.yaml; nothing in
harness/ names an arm. Torch-free: the planner reads the registry; an arm's trainer module is imported by
`build_trainer`, inside the process that trains.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from arms.common import ArmSpec

#: the order of the built-in arms in tables and plots; arms added later follow, by name
ORDER = ("sft", "grpo", "papo", "evi_po")


@functools.cache
def registry() -> dict[str, ArmSpec]:
    """name -> ArmSpec of every arm package, in ORDER then by name."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.ispkg:
            continue
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ARM", None)
        if spec is None:
            continue
        if spec.name != info.name:
            raise ValueError(f"arms/{info.name}/__init__.py registers the arm {spec.name!r}: the package, the "
                             "ArmSpec name and conf/arm/<name>.yaml share one name")
        found[spec.name] = spec
    rank = {name: i for i, name in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def get(name: str) -> ArmSpec:
    """The arm's entry; a KeyError names the registered arms."""
    arms = registry()
    if name not in arms:
        raise KeyError(f"{name!r} is not a registered arm ({', '.join(arms)})")
    return arms[name]


def build_trainer(name: str, ctx):
    """The arm's TRL trainer, built from an arms.common.BuildContext (imports torch and trl)."""
    return importlib.import_module(get(name).trainer).build_trainer(ctx)
