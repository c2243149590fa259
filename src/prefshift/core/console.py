"""Where user-facing messages go: stderr, printed exactly as written.

Messages carry paths, dataset names and param values such as `methods=[naive, seam]`. By default
rich reads brackets as markup, so it would drop `[naive, seam]` and raise MarkupError on a path
like `[/tmp/x]`, and it hard-wraps a long path mid-word, so a path the user must copy comes out
broken. Message consoles print text verbatim and leave wrapping to the terminal.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text


def messages() -> Console:
    return Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def error_text(message: object) -> Text:
    """`error: <message>`, the label styled and the message verbatim."""
    return Text.assemble(("error:", "bold red"), " ", str(message))
