"""The one base class for errors a user can fix, the one wording of file-system failures, and
the library errors the CLI's one boundary knows.

The CLI prints a PrefshiftError without a traceback. An OSError that names a file is the
same kind of problem (a path that is missing, a directory, read-only, full) and is printed
the same way, through `file_error_message`, so every command says it in one line.

Some errors come from libraries, deep below the code that knows which file, row or store was
being read: a JSON number too long for Python to convert, text that is not UTF-8 or holds a
lone surrogate, a tokenizer given something that is not text, a damaged or locked sqlite
database, an MLflow store that refuses a path. The code that opens a file or a store wraps
its work in `naming(...)`, which attaches that name to any error passing out; the boundary
(`boundary_line`) turns the known kinds into `<what>: <cause>; <what to do>`. Anything else
keeps its traceback: it is a bug to fix, not an input to correct.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager, suppress

JSON_TOO_DEEP = (
    "JSON nested too deeply to read (arrays or objects inside each other beyond Python's recursion "
    "limit); flatten it"
)

_WHAT_TO_DO = {
    errno.ENOENT: "check the path",
    errno.EISDIR: "name a file, not a directory",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EACCES: "check its permissions, or use another path",
    errno.EPERM: "check its permissions, or use another path",
    errno.EROFS: "the file system is mounted read-only: use a writable path",
    errno.ENOSPC: "the disk is full: free some space, then run again",
    errno.EDQUOT: "the disk quota is used up: free some space, then run again",
    errno.EFBIG: "the file grew past the file system's limit: use another file system",
}


class PrefshiftError(Exception):
    """An input, params or state problem; the message says what is wrong and what to do."""


def os_error_cause(err: OSError) -> str:
    """The cause of `err` in words and what to do: `no space left on device; the disk is full: …`."""
    cause = (err.strerror or str(err) or type(err).__name__).rstrip(".")
    cause = cause[:1].lower() + cause[1:]
    hint = _WHAT_TO_DO.get(err.errno)
    return f"{cause}; {hint}" if hint else cause


def file_error_message(err: OSError) -> str:
    """`<path>: <cause>` for an OSError that names its file (both paths for a failed rename)."""
    where = str(err.filename)
    if err.filename2 is not None:
        where = f"{where} -> {err.filename2}"
    return f"{where}: {os_error_cause(err)}"


WHERE = "prefshift_where"
"""The attribute `naming` sets on an error: the innermost file, row or store being worked on."""


@contextmanager
def naming(where: str) -> Iterator[None]:
    """Attach `where` (a file, `file line N`, a store) to any error raised inside, unless code
    closer to the failure named it already; the CLI's boundary prints it."""
    try:
        yield
    except Exception as err:
        if getattr(err, WHERE, None) is None:
            with suppress(AttributeError):  # an exception type with __slots__ keeps no name
                setattr(err, WHERE, where)
        raise


def json_problem(err: ValueError | RecursionError) -> str:
    """Why JSON text could not be read, for a user: json.loads raises only ValueErrors (bad
    syntax, bytes that are not UTF-8, a number past Python's digit limit) or RecursionError."""
    if isinstance(err, RecursionError):
        return JSON_TOO_DEEP
    if _is_digit_limit(err):
        return value_problem(err)
    return f"not valid JSON ({err})"


def value_problem(err: ValueError) -> str:
    """A ValueError from parsing in words: Python's own advice on its digit limit is for programmers."""
    if _is_digit_limit(err):
        return (
            "a number with more digits than Python converts (its limit is 4300); no value needs "
            "that many: remove or shorten it"
        )
    return f"a value that cannot be read ({err})"


def _is_digit_limit(err: BaseException) -> bool:
    return isinstance(err, ValueError) and "integer string conversion" in str(err)


def _classes(err: BaseException) -> set[str]:
    """`module.Class` of every class `err` is an instance of (no library is imported to check)."""
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(err).__mro__}


def library_problem(err: BaseException) -> str | None:
    """`<cause>; <what to do>` for a library error a bad input or store produces, else None."""
    classes = _classes(err)
    text = " ".join(str(err).split())
    if _is_digit_limit(err) or "json.decoder.JSONDecodeError" in classes:
        return json_problem(err)
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text ({text}); save it as UTF-8"
    if isinstance(err, UnicodeError):
        return (
            f"text that cannot be encoded ({text}), such as a lone surrogate escape like \\ud800; "
            "remove it or replace it with the character it stands for"
        )
    if isinstance(err, TypeError) and ("TextEncodeInput" in text or "TextInputSequence" in text):
        return f"the tokenizer was given something that is not text ({text}); give every text as a string"
    if classes & {"sqlite3.Error", "sqlalchemy.exc.SQLAlchemyError"}:
        return _store_problem(" ".join(str(getattr(err, "orig", None) or err).split()))
    if "mlflow.exceptions.MlflowException" in classes:
        said = " ".join(str(getattr(err, "message", err)).split())
        return _store_problem(said)
    return None


def _store_problem(said: str) -> str:
    lowered = said.lower()
    if "outside the artifact directory" in lowered or "invalid path" in lowered:
        hint = "the store holds a path outside the model's folder (a link?): register the model again"
    elif "database is locked" in lowered or "database table is locked" in lowered:
        hint = "another process holds the database: wait until it finishes (or stop it), then run again"
    elif any(s in lowered for s in ("not a database", "disk image is malformed", "no such table")):
        hint = (
            "the database file is damaged or is not an MLflow database: restore it from a backup, or "
            "move it away (the pipeline records into a new one)"
        )
    else:
        hint = "check the tracking store (MLFLOW_TRACKING_URI) and that this prefshift's MLflow can read it"
    return f"{said[:300]}; {hint}"


def boundary_line(err: BaseException) -> str | None:
    """The one line the CLI prints for `err`, or None when it is not an input or store problem."""
    if isinstance(err, PrefshiftError):
        return str(err)
    if isinstance(err, OSError) and err.filename is not None:
        return file_error_message(err)
    problem = library_problem(err)
    if problem is None:
        return None
    where = getattr(err, WHERE, None)
    return f"{where}: {problem}" if where else problem
