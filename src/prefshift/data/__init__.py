"""Data: the pair schema, source adapters, the synthetic suite and the split protocol."""
