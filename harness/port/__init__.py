"""Port a verl or EasyR1 recipe to the harness: `python -m harness.port SOURCE CONFIG.yaml [KEY=VALUE ...]`.

Every leaf field of the source (its schema's defaults, the recipe file, the launch script's overrides) is
classified once (exact, semantically_conformant, locally_lowered, informational_only, distributed_only,
not_implemented, unsupported) by the source's rule table (harness.port.verl, harness.port.easyr1); the mapped
ones become harness overrides in the harness's units, which are composed and planned in-process. Unknown fields,
unsupported values and overrides that do not plan are problems (exit 2). Torch-free: part of the control plane.
"""

from harness.port.pipeline import port

__all__ = ["port"]
