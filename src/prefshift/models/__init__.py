"""Models: backbones (tiny ones built locally, or Hugging Face models), the reward model with
its scalar head (and the shared-prefix packing that computes a pair's prompt once on a decoder),
and the checks a model directory must pass before it is loaded.

May import: core, config, data. Nothing that trains or tracks.
"""
