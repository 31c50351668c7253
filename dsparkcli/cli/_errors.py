"""The one table that turns expected exceptions into one line on stderr and an exit code."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

from dsparkcli.errors import DsparkError

EXIT_INTERRUPTED = 130


def _oserror(exc: BaseException) -> tuple[str, int]:
    assert isinstance(exc, OSError)
    if exc.errno == errno.ENOSPC:
        return f"disk full while writing {exc.filename or 'a file'}: free space and run the command again", 6
    if isinstance(exc, FileNotFoundError):
        return f"file not found: {exc.filename}", 2
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename}", 2
    if isinstance(exc, IsADirectoryError):
        return f"is a directory, expected a file: {exc.filename}", 2
    return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), 1


# Order matters: the first matching class wins. Foreign exceptions only; DsparkError carries its own.
TABLE: list[tuple[type[BaseException], Callable[[BaseException], tuple[str, int]]]] = [
    (DsparkError, lambda e: (str(e), e.exit_code)),  # type: ignore[attr-defined]
    (KeyboardInterrupt, lambda e: ("interrupted", EXIT_INTERRUPTED)),
    (OSError, _oserror),
]


def message_for(exc: BaseException) -> tuple[str, int] | None:
    """The (one-line message, exit code) for an expected exception, or None for a bug."""
    for cls, render in TABLE:
        if isinstance(exc, cls):
            text, code = render(exc)
            return " ".join(str(text).split()), code  # one line, whatever the source said
    return None


def report(exc: BaseException) -> int:
    found = message_for(exc)
    if found is None:
        raise exc
    text, code = found
    print(f"dspark: error: {text}", file=sys.stderr)
    return code
