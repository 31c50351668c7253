"""Option aliases shared by several commands (Annotated, as in huggingface_hub's CLI)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dsparkcli.bench.tuned import parse_auto

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
BudgetOpt = Annotated[Optional[str], typer.Option("--budget", "-b", help="--spec-draft-n-max, or 'auto': the `dspark tune` choice (default: registry, 5).")]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculative draft.")]
PMinOpt = Annotated[Optional[float], typer.Option("--p-min", help="Stop a draft at confidence < P (0..1).")]
AutoPMinOpt = Annotated[Optional[str], typer.Option("--p-min", help="Stop a draft at confidence < P (0..1), or 'auto' (the tuning's).")]
CategoryOpt = Annotated[Optional[str], typer.Option("--category", help="Which tuned category --budget auto uses (default: overall).")]
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


def knob_values(budget: str | None, p_min: str | None) -> dict:
    """--budget / --p-min text (a number or 'auto') as ServerKnobs fields; a bad value is a one-line error."""
    b, auto_b = parse_auto(budget, "--budget", int)
    p, auto_p = parse_auto(p_min, "--p-min", float)
    return {"budget": b, "p_min": p, "auto_budget": auto_b, "auto_p_min": auto_p}
