"""`python -m harness.report DIR`: compare the runs under DIR (docs/architecture.md). Torch-free.

Modules: runs (find and read run dirs and sweep job records), compare (groups by data/model
identity, conditions, summaries over seeds, paired comparison), stats (t intervals, exact and
Monte Carlo bootstrap), plots (PNG), render (markdown, stdout), cli (the command).
"""
