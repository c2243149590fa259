"""Print pyproject.toml's [tool.prefshift] test-no-deps: the test-only packages the Makefile
installs with `pip install --no-deps` (an extra cannot say --no-deps)."""

import sys

try:
    import tomllib
except ImportError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

with open(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml", "rb") as handle:
    print(" ".join(tomllib.load(handle)["tool"]["prefshift"]["test-no-deps"]))
