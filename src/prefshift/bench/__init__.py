"""`prefshift bench`: interleaved timing of our training and scoring against the usual alternatives.

Every comparison runs its variants in turn (A B A B ...) after a discarded warm-up
round, so machine load drifts into all variants alike; ratios of medians are what
the report quotes, absolute times are context. Training runs each happen in a fresh
process forked from a server that has already imported torch, so one run's memory
never counts against the next and peak RSS is per run.
"""
