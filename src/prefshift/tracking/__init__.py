"""Tracking: MLflow runs (`runs`), the model registry with its pyfunc flavour and pulls
(`registry`), `prefshift score` on a pulled model (`score`), sync to a shared server, the UI.

May import: core, config, data, models, methods, engine, science. Not the pipeline or the CLI.
"""
