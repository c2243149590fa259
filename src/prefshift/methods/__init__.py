"""Training objectives: one function per loss, one interface for the training loop."""
