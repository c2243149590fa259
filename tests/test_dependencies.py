"""What the installed dependencies must provide beyond their Python API."""

from __future__ import annotations

import platform

import pytest


@pytest.mark.skipif(platform.python_implementation() != "CPython", reason="the C parser is CPython's")
def test_dvc_reads_its_yaml_with_ruamel_s_c_parser():
    """DVC's safe loads of dvc.yaml and dvc.lock go through `ruamel.yaml.YAML(typ="safe")`, which
    takes the C parser only where ruamel.yaml.clib is importable (pyproject.toml installs it):
    without it a no-op `dvc repro` of the embedded default spent seconds more in pure-Python YAML
    (bench/dvc_yaml_loader.py)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.main import CParser

    assert CParser is not None, "ruamel.yaml.clib is missing: pip install 'ruamel.yaml.clib>=0.2.7'"
    assert YAML(typ="safe").Parser is CParser
