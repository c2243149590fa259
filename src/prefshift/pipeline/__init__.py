"""Pipeline: the DVC stages (`stages/`, one module per stage), their output sets and
held-out score files, and the sweep over DVC experiments.

May import every layer below it (core … tracking); only the CLI and bench sit above it.
"""
