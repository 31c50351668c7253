"""Option aliases shared by several commands (Annotated, as in huggingface_hub's CLI)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.budget.limits import ADAPTIVE, parse_auto  # standard library only: light at start-up
from dsparkcli.errors import UsageError
from dsparkcli.llama.flags import check_extra_args  # not llama.server: every start-up imports this module
from dsparkcli.llama.placement import Placement, parse_endpoints, parse_tensor_split
from dsparkcli.llama.speculation import METHODS_HELP, SPEC_HELP  # standard library only

LlamaBinOpt = Annotated[
    Optional[str],
    typer.Option("--llama-bin", envvar="DSPARK_LLAMA_BIN", help="llama-server binary (or its folder) to use."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]

# The model files and server knobs shared by run, serve and bench.
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help="Pair name from models.toml.")]
TargetOpt = Annotated[Optional[str], typer.Option("--target", help="Target GGUF: path or hf://owner/repo/file.")]
DraftOpt = Annotated[Optional[str], typer.Option("--draft", help="DSpark draft GGUF: path or hf://owner/repo/file.")]
# bench compares drafts: the same --draft, repeatable, each optionally labelled
DraftsOpt = Annotated[
    Optional[list[str]],
    typer.Option("--draft", help="Draft GGUF path or registry key, optionally LABEL=PATH (repeatable)."),
]
# bench and tune measure a subset of a kit's categories (run/serve's --category is CategoryOpt: one tuned pick)
CategoriesOpt = Annotated[
    Optional[list[str]],
    typer.Option("--category", help="Only these categories (repeatable; 'text', 'vision' name groups)."),
]
# tune's candidate thresholds (run/serve/bench take one --p-min, or auto: PMinOpt, AutoPMinOpt)
PMinsOpt = Annotated[
    Optional[list[float]],
    typer.Option("--p-min", help="Candidate confidence thresholds (default 0, plus 0.3 0.6 with a confidence head)."),
]
SynthLenOpt = Annotated[
    Optional[float],
    typer.Option(
        "--synth-len",
        help="SYNTHETIC acceptance length at the largest budget (--spec-synth-len); labels every output.",
    ),
]
# the address a server or worker binds: loopback unless asked (each command sets its own default port)
HostOpt = Annotated[str, typer.Option("--host", help="Address to bind (loopback by default).")]
PortOpt = Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="Port (0 = any free one).")]
# the draft's dflash.block_size: the largest budget it proposes (synth and distill write it)
BlockSizeOpt = Annotated[
    int, typer.Option("--block-size", min=1, max=16, help="dflash.block_size: the largest budget.")
]
# fetch downloads one of a registry pair's drafts: --draft names it by its key
FetchDraftOpt = Annotated[
    Optional[str], typer.Option("--draft", help="Draft key (default: the pair's default draft).")
]
MmprojOpt = Annotated[Optional[str], typer.Option("--mmproj", help="Vision projector GGUF: path or hf://.")]
DraftKeyOpt = Annotated[Optional[str], typer.Option("--draft-key", help="Which registry draft (e.g. q8_0).")]
BudgetOpt = Annotated[
    Optional[str],
    typer.Option(
        "--budget",
        "-b",
        help="--spec-draft-n-max, or 'auto': the `dspark tune` choice, or 'adaptive': llama.cpp picks each step's budget from the tuning's cost table (default: registry, 5).",
    ),
]
# bench compares budgets: the same --budget, several values (one arm each)
BudgetsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--budget",
        "-b",
        help="Draft budgets (--spec-draft-n-max): --budget 5 15; 'auto': the `dspark tune` choice; 'adaptive': llama.cpp picks each step's budget from the tuning's cost table (an arm per draft).",
    ),
]
NoDraftOpt = Annotated[bool, typer.Option("--no-draft", help="Plain decoding, no speculative draft.")]
# --spec (llama.speculation): run and serve take one, bench any number (its configurations beside plain)
SpecOpt = Annotated[Optional[str], typer.Option("--spec", help=SPEC_HELP)]
SpecsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--spec",
        help=SPEC_HELP + " Repeatable: each is a configuration; dspark's run only when listed or --draft given.",
    ),
]
# tune --methods (budget.methods): the speculation methods a tuning measures and picks from, per category
MethodsOpt = Annotated[Optional[list[str]], typer.Option("--methods", help=METHODS_HELP)]
PMinOpt = Annotated[Optional[float], typer.Option("--p-min", help="Stop a draft at confidence < P (0..1).")]
AutoPMinOpt = Annotated[
    Optional[str], typer.Option("--p-min", help="Stop a draft at confidence < P (0..1), or 'auto' (the tuning's).")
]
CategoryOpt = Annotated[
    Optional[str], typer.Option("--category", help="Which tuned category --budget auto uses (default: overall).")
]
# --ctx has one default everywhere: none, so llama-server uses the model's trained context. (bench had 4096 and
# tune none, one cause of their tuning keys not matching; a measurement that wants a bound gives --ctx.)
CtxOpt = Annotated[
    Optional[int], typer.Option("--ctx", "-c", min=64, help="Context size (-c; default: the model's trained context).")
]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads (-t).")]
NglOpt = Annotated[Optional[str], typer.Option("--ngl", help="GPU layers for target and draft (-ngl/-ngld).")]
ApiKeyOpt = Annotated[
    Optional[str],
    typer.Option(
        "--api-key", help="API key; visible in `ps`: prefer DSPARK_API_KEY or --api-key-file (never logged)."
    ),
]
ApiKeyFileOpt = Annotated[
    Optional[Path],
    typer.Option("--api-key-file", help="Read the API key from this file (its first line).", show_default=False),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Download missing files without asking.")]

# Declared once for every command that takes them (run, bench, tune, synth, distill), so a flag means the same
# in each. Defaults that differ do so on purpose and stay at the parameter: tune measures a grid of cells, so
# its --reps, --limit and --n-predict are smaller than bench's.
SEED = 0  # the one --seed default: the same command line gives the same requests and the same files
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed",
        help="Seed of the requests' sampling and of what the command generates (the same seed, the same output).",
    ),
]
PromptsOpt = Annotated[str, typer.Option("--prompts", help="Built-in kit name or a JSONL file (docs/PROMPTS.md).")]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", min=1, help="At most N prompts per category.")]
RepsOpt = Annotated[int, typer.Option("--reps", min=1, help="Timed repetitions of every prompt.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", min=0, help="Untimed requests per server before the timed ones.")]
NPredictOpt = Annotated[int, typer.Option("--n-predict", "-n", min=1, help="Tokens to generate per request.")]
IgnoreEosOpt = Annotated[bool, typer.Option("--ignore-eos", help="Always generate --n-predict tokens.")]

# Where the model goes (run, serve, bench, tune): typed llama.cpp placement options (llama.placement).
RpcOpt = Annotated[
    Optional[str],
    typer.Option("--rpc", metavar="HOST:PORT,...", help="rpc workers (dspark rpc-worker) to place the target on."),
]
SplitModeOpt = Annotated[
    Optional[str],
    typer.Option("--split-mode", metavar="layer|row", help="Split across devices by layer or by weight rows (-sm)."),
]
TensorSplitOpt = Annotated[
    Optional[str],
    typer.Option("--tensor-split", metavar="N0,N1,...", help="Proportion of the model per device, e.g. 3,1 (-ts)."),
]
MainGpuOpt = Annotated[
    Optional[int], typer.Option("--main-gpu", min=0, help="Device index for intermediate results (row split) (-mg).")
]
DraftDeviceOpt = Annotated[
    Optional[str],
    typer.Option(
        "--draft-device", metavar="DEV,...", help="The draft's devices, e.g. CUDA0 or none (= this process) (-devd)."
    ),
]


# Arguments after a bare `--` on the command line, passed verbatim to llama-server by run/serve/bench.
# app.main() splits them off before Typer parses, so a positional PROMPT cannot swallow them.
PASSTHROUGH: list[str] = []


def passthrough_args() -> tuple[str, ...]:
    """The arguments after `--`, refused up front (before any download) when they set what dspark owns."""
    args = tuple(PASSTHROUGH)
    check_extra_args(args)
    return args


API_KEY_ENV = "DSPARK_API_KEY"


def api_key_from(given: str | None, key_file: Path | None) -> str | None:
    """The API key from --api-key-file, DSPARK_API_KEY or (with a warning: every user sees argv in `ps`)
    --api-key; one of them at most."""
    if given is not None and key_file is not None:
        raise UsageError("give --api-key or --api-key-file, not both")
    if key_file is not None:
        try:
            lines = key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read --api-key-file {key_file}: {getattr(e, 'strerror', None) or e}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise UsageError(f"--api-key-file {key_file} is empty")
        return key
    if given is not None:
        print(
            f"dspark: warning: --api-key on the command line is visible to every user of this machine (ps); "
            f"use {API_KEY_ENV} or --api-key-file",
            file=sys.stderr,
        )
        return given
    return os.environ.get(API_KEY_ENV) or None


def knob_values(budget: str | None, p_min: str | None) -> dict:
    """--budget / --p-min text (a number or 'auto') as ServerKnobs fields; a bad value is a one-line error."""
    b, auto_b = parse_auto(budget, "--budget", int, adaptive=True)
    p, auto_p = parse_auto(p_min, "--p-min", float)
    adaptive = b == ADAPTIVE
    return {
        "budget": None if adaptive else b,
        "p_min": p,
        "auto_budget": auto_b,
        "auto_p_min": auto_p,
        "adaptive_budget": adaptive,
    }


def placement_of(
    rpc: str | None, split_mode: str | None, tensor_split: str | None, main_gpu: int | None, draft_device: str | None
) -> Placement:
    """The typed placement options as one validated ``Placement``."""
    placement = Placement(
        rpc=parse_endpoints(rpc) if rpc else (),
        split_mode=split_mode,
        tensor_split=parse_tensor_split(tensor_split) if tensor_split else (),
        main_gpu=main_gpu,
        draft_device=draft_device,
    )
    placement.validate()
    return placement
