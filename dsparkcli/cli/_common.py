"""Option aliases shared by several commands (Annotated, as in huggingface_hub's CLI)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

LlamaBinOpt = Annotated[
    Optional[str],
    typer.Option("--llama-bin", envvar="DSPARK_LLAMA_BIN", help="llama-server binary (or its folder) to use."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]

# The model files and server knobs shared by run, serve and bench.
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Pair name from models.toml.")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Target GGUF: path or hf://owner/repo/file.")]
DraftOpt = Annotated[Optional[str], typer.Option("--draft", help="DSpark draft GGUF: path or hf://owner/repo/file.")]
MmprojOpt = Annotated[Optional[str], typer.Option("--mmproj", help="Vision projector GGUF: path or hf://.")]
DraftKeyOpt = Annotated[Optional[str], typer.Option("--draft-key", help="Which registry draft (e.g. q8_0).")]
BudgetOpt = Annotated[Optional[int], typer.Option("--budget", "-b", min=1, help="--spec-draft-n-max (default: registry, 5).")]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculative draft.")]
PMinOpt = Annotated[Optional[float], typer.Option("--p-min", help="Stop a draft at confidence < P (0..1).")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", "-c", min=64, help="Context size (-c).")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads (-t).")]
NglOpt = Annotated[Optional[str], typer.Option("--ngl", help="GPU layers for target and draft (-ngl/-ngld).")]
ApiKeyOpt = Annotated[Optional[str], typer.Option("--api-key", envvar="DSPARK_API_KEY", help="API key (never logged).")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Download missing files without asking.")]


# Arguments after a bare `--` on the command line, passed verbatim to llama-server by run/serve/bench.
# app.main() splits them off before Typer parses, so a positional PROMPT cannot swallow them.
PASSTHROUGH: list[str] = []


def passthrough_args() -> tuple[str, ...]:
    return tuple(PASSTHROUGH)
