"""Stage entry points: one module per DVC stage, called by the CLI."""
