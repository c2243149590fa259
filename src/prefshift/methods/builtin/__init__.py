"""prefshift's own methods, one module each, registered through the `prefshift.methods`
entry-point group exactly as a third-party method is (pyproject.toml)."""
