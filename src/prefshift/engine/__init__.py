"""Engine: computation on models. The training loop, reward scoring (pairs, groups, rows),
the reference store and cache that ANCHOR reads, SEAM's generation and policy sampling.

May import: core, config, data, models, methods. It knows nothing of stages, MLflow or the
CLI (pipeline, tracking and cli are off limits): callers pass observers in and take results out.
"""
