"""Data: the pair schema, source adapters, the synthetic suite, the split protocol, encoding
and the benchmarks' section tables.

May import: core, config. Never models, methods, the engine or science: data is read and
shaped here, never scored.
"""
