"""Option aliases shared by several commands (Annotated, as in huggingface_hub's CLI)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

LlamaBinOpt = Annotated[
    Optional[str],
    typer.Option("--llama-bin", envvar="DSPARK_LLAMA_BIN", help="llama-server binary (or its folder) to use."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]


# Arguments after a bare `--` on the command line, passed verbatim to llama-server by run/serve/bench.
# app.main() splits them off before Typer parses, so a positional PROMPT cannot swallow them.
PASSTHROUGH: list[str] = []


def passthrough_args() -> tuple[str, ...]:
    return tuple(PASSTHROUGH)
