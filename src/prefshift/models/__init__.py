"""Reward models and backbones."""
