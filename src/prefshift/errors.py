"""The one base class for errors a user can fix; the CLI prints these without a traceback."""


class PrefshiftError(Exception):
    """An input, params or state problem; the message says what is wrong and what to do."""
