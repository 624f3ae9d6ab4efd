"""The metrics of a finished run, as the report names them (harness.report.runs.run_metrics computes them): the
table columns, and what `objective` (a sweep job's return value for an optimizing sweeper) may name. No imports:
the planner checks `objective` against it."""

RELATIONS = ("FULL", "CONTROL", "MISSING", "SUBSTITUTE")

# (key, short title) in table order; every key is a run metric (harness.report.runs.run_metrics).
EVAL_METRICS = [
    ("eval/accuracy", "accuracy"),
    ("eval/accuracy_before", "accuracy before (init)"),
    ("eval/accuracy_change", "change"),
    *[(f"eval/{rel}/accuracy", rel) for rel in RELATIONS],
    ("eval/FULL/abstention_rate", "FULL abstention"),
    ("eval/format_valid", "format valid"),
    ("eval/direction_accuracy", "direction accuracy"),
]
TRAIN_METRICS = [
    ("train/reward_last10pct", "train reward (last 10% of steps)"),
    ("budget/tokens", "tokens used"),
    ("budget/ceiling", "token ceiling"),
    ("budget/fraction", "% of ceiling"),
    ("train/optimizer_steps", "optimizer steps"),
    ("perf/wall_time_s", "wall time (s)"),
    ("perf/first_step_s", "time to first step (s)"),  # from the run's own start: a parent run first is not counted
]
# rollout=async runs only (None elsewhere): from each completion's trace row (policy_age, is_weight)
OFFPOLICY_METRICS = [
    ("offpolicy/mean_age", "mean policy age (rounds)"),
    ("offpolicy/weight_drift", "IS weight drift (mean abs(w - 1))"),
    ("offpolicy/masked", "share masked by the IS caps"),
]
PAIRED_METRICS = [k for k, _ in EVAL_METRICS if k != "eval/accuracy_before"] + ["train/reward_last10pct"]
METRIC_TITLES = dict(EVAL_METRICS + TRAIN_METRICS + OFFPOLICY_METRICS)
