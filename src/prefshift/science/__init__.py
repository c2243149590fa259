"""Science: the numbers a report states. Metrics and intervals, diagnostics, paired
comparisons, best-of-n, the benchmarks' official scoring rules, linear probes, figures.

Pure functions of scores and rows. May import: core, config, data. Never tracking, never a
training loop (engine), never the pipeline.
"""
