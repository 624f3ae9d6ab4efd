"""`python -m harness.report DIR`: compare the runs under DIR (docs/architecture.md). Torch-free.

Modules: runs (find and read run dirs and sweep job records), compare (groups by data/model
identity, conditions, summaries over seeds, paired comparison), stats (t intervals, exact and
Monte Carlo bootstrap), itemstats (hierarchical bootstrap paired by view), power (seeds and views
needed), robust (IQM, probability of improvement, performance profile), efficiency (area under
accuracy vs tokens, tokens to a threshold, the ScaleRL fit), analysis (those per group), plots
(PNG), render and render_stats (markdown, stdout), cli (the command).
"""
