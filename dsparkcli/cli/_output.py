"""Rendering helpers shared by the command modules: one stdout console, one stderr console, JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 here; cli.app.main ends every command the same quiet way when the reader quits
        raise BrokenPipeError


def _console(stderr: bool) -> Console:
    # Off a terminal (pipes, CI logs, `make demo | tee`) rich would squeeze wide tables into 80 columns;
    # lay them out at COLUMNS or 160 instead, so they stay readable.
    console = _Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _Console(stderr=stderr, highlight=False, soft_wrap=True, width=160)
    return console


out = _console(stderr=False)
err = _console(stderr=True)


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_default, indent=2, sort_keys=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()
