"""Core: what every layer needs and no layer owns.

Owns errors (one-line user errors), atomic writes and the output-ownership rule, writer
locks, the project layout (paths), host facts, console and progress lines, signal handling.
May import: nothing else from prefshift. Everything else may import it.
"""
