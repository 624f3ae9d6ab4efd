"""`python -m harness.report DIR`: compare the runs under DIR (DESIGN.md sections 13 and 15). Torch-free.

Modules: runs (find and read run dirs and sweep job records), compare (groups by data/model
identity, conditions, summaries over seeds, paired comparison), stats (t intervals, exact and
Monte Carlo bootstrap), plots (PNG), render (markdown, stdout), cli (the command).
"""
