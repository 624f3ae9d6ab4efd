"""The run lifecycle after planning: claim the run dir, then the stages that train.

    claim (lock, manifest) -> prepare data -> build model -> train -> finalize

Training lands with the training issue; until then a train-mode run stops after claiming its
run dir, with its manifest at status `planned`, and says so.
"""

from __future__ import annotations

import logging

from harness.plan import Plan
from harness.rundir import claim

log = logging.getLogger("harness")


def execute(plan: Plan) -> int:
    with claim(plan) as run:
        status = run.manifest["status"]
        if status == "completed":
            log.info("run %s is already complete; nothing to do (%s)", plan.run_name, run.path)
            return 0
        log.info("run dir: %s (%s)", run.path, "existing, status " + status if run.resumed else "new")
        log.info("planned: arm=%s model=%s data=%s seed=%s, budget %s",
                 plan.config["arm"]["name"], plan.config["model"]["name"], plan.config["data"]["name"],
                 plan.config["seed"], _budget_line(plan))
        log.info("training is not implemented yet (it lands with the training issue): the run dir holds the "
                 "plan with status 'planned'. Inspect it with: python -m harness.verify %s", run.path)
        return 0


def _budget_line(plan: Plan) -> str:
    b = plan.budget
    if b["kind"] == "completion_tokens":
        return f"{b['completion_token_ceiling']} sampled tokens, <= {b['max_steps']} steps"
    return f"{b['loss_token_ceiling']} loss tokens, <= {b['max_steps']} steps"
