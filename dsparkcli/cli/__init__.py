"""Thin Typer layer: parse, call the core, render. No logic that a test of the core would miss."""

from __future__ import annotations

import sys

from dsparkcli import __version__


def main(argv: list[str] | None = None) -> int:
    """The `dspark` console script. `--version` answers here, before anything else is imported (typer and
    the shared options were two thirds of that start-up); every other command line is cli.app.main's."""
    args = sys.argv[1:] if argv is None else argv
    if args in (["--version"], ["-V"]):
        print(f"dspark {__version__}")
        return 0
    from dsparkcli.cli import app  # deferred: the one import `--version` does without (docs/DESIGN.md)

    return app.main(argv)
