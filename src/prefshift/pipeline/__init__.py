"""Pipeline: the DVC stages (`stages/`, one module per stage), one training run as a stage runs
it (`fit.py`: the MLflow run, the save, the held-out scores), output sets, held-out score files,
and the sweep over DVC experiments.

May import every layer below it (core … tracking); only the CLI, bench and presets sit above it.
"""
