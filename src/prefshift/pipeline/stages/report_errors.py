"""The report's one error class, apart so that its section modules can raise it without
importing the report stage that imports them."""

from prefshift.core.errors import PrefshiftError


class ReportError(PrefshiftError):
    """Metrics that are missing or cannot be put side by side."""
