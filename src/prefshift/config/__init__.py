"""Config: the params schema (`params.py`), its loading and its overrides.

May import: core. It must not import data, models or anything above: every layer reads
params, so params read nothing but themselves.
"""
