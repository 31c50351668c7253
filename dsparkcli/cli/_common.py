"""Option aliases shared by several commands (Annotated, as in huggingface_hub's CLI)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

LlamaBinOpt = Annotated[
    Optional[str],
    typer.Option("--llama-bin", envvar="DSPARK_LLAMA_BIN", help="llama-server binary (or its folder) to use."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
