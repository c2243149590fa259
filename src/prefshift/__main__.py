"""`python -m prefshift` runs the CLI (same as the `prefshift` console script)."""

from prefshift.cli import main

main()
