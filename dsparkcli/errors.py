"""Expected failures. Each carries a one-line message a user can act on and an exit code.

The CLI maps these (and a few foreign exceptions, see ``dsparkcli.cli._errors``) to one line on
stderr; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class DsparkError(Exception):
    """Base of every expected failure. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(DsparkError):
    """Bad input from the user: a wrong flag value, a missing file, an unreadable image."""

    exit_code = 2


class EngineNotFoundError(DsparkError):
    """No llama.cpp binary could be located."""

    exit_code = 3


class EngineCapabilityError(DsparkError):
    """The located binary lacks something dspark needs (e.g. ``draft-dspark``)."""

    exit_code = 3


class EngineBuildError(DsparkError):
    """Fetching or compiling llama.cpp failed."""

    exit_code = 3


class ServerError(DsparkError):
    """llama-server failed to start, crashed, or answered with an error.

    ``log_tail`` holds the last lines of the server log, for the user and for tests.
    """

    exit_code = 4

    def __init__(self, message: str, *, hint: str | None = None, log_tail: str = "", kind: str = "error") -> None:
        super().__init__(message, hint=hint)
        self.log_tail = log_tail
        self.kind = kind  # usage | missing-file | bad-gguf | out-of-memory | unsupported-arch | port | crash | http | timeout | error


class GGUFError(DsparkError):
    """A GGUF file is malformed, truncated or hostile."""

    exit_code = 2


class PairingError(DsparkError):
    """A draft or mmproj does not fit its target (vocab, hidden size, taps, arch; the projector's width)."""

    exit_code = 1


class HubError(DsparkError):
    """Fetching from the Hugging Face hub failed (auth, 404, offline, disk)."""

    exit_code = 5


class VerificationError(DsparkError):
    """A file's size or sha256 does not match what was pinned or what the hub reports."""

    exit_code = 6


class BenchError(DsparkError):
    """A benchmark configuration produced an invalid result (e.g. drafted nothing)."""

    exit_code = 7


class Interrupted(DsparkError):
    """Ctrl-C or SIGTERM cut the work short; the message says what was kept (one line, like any error)."""

    exit_code = 130
