"""`dspark run [IMAGE...] PROMPT`: one question, streamed, with the acceptance statistics."""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli import runner
from dsparkcli.cli._common import (
    SEED,
    ApiKeyFileOpt,
    ApiKeyOpt,
    AutoPMinOpt,
    BudgetOpt,
    CategoryOpt,
    CtxOpt,
    DraftDeviceOpt,
    DraftKeyOpt,
    DraftOpt,
    JsonOpt,
    LlamaBinOpt,
    MainGpuOpt,
    MmprojOpt,
    ModelOpt,
    NglOpt,
    NoDraftOpt,
    RpcOpt,
    SeedOpt,
    SpecOpt,
    SplitModeOpt,
    TargetOpt,
    TensorSplitOpt,
    ThreadsOpt,
    YesOpt,
    api_key_from,
    knob_values,
    passthrough_args,
    placement_of,
)
from dsparkcli.cli._download import confirm_downloads, download_progress
from dsparkcli.cli._output import err, print_json
from dsparkcli.errors import DsparkError, UsageError
from dsparkcli.images import load_image, names_an_image
from dsparkcli.llama import protocol, speculation
from dsparkcli.pairs import Downloads, PairSpec, ServerKnobs

HELP = """Answer a prompt (optionally about images) with DSpark speculative decoding.

The last argument is the prompt; arguments before it are images. Starts llama-server with the
target, its vision projector and the DSpark draft, streams the answer to stdout and prints one
line of statistics to stderr. Arguments after `--` go to llama-server verbatim.

\b
Examples:
  dspark run photo.png "What is in this picture?"
  dspark run "Write a haiku about GPUs" --max-tokens 64
  dspark run chart.png "Summarise the trend" --budget 7 --json
  dspark run chart.png "Summarise the trend" --budget auto --category charxiv   # `dspark tune`'s pick
  dspark run chart.png "Summarise the trend" --budget adaptive   # llama.cpp picks per step (tune's costs)
  dspark run --target t.gguf --draft d.gguf --mmproj mm.gguf img.png "Describe it"
  dspark run photo.png "Describe" --no-draft            # plain decoding, same greedy text
  dspark run "Write a Python function that reverses a string." --model smollm2-135m --compare
                                                        # ...and is it? where it parts, and why
  dspark run photo.png "Describe" --server http://127.0.0.1:8080   # reuse `dspark serve`
  dspark run photo.png "Describe" -- -ngl 99 -fa on     # extra llama-server flags
  dspark run "Hi" --rpc 10.0.0.2:50052,10.0.0.3:50052   # target on two rpc workers
  dspark run "Hi" --split-mode layer --tensor-split 3,1 --draft-device CUDA0
"""


def format_stats(result: runner.RunResult) -> str:
    parts = [
        f"decode {result.decode_tok_s:.1f} tok/s",
        f"prompt {result.prompt_tok_s:.1f} tok/s",
        f"{result.n_tokens} tokens",
    ]
    acc = result.acceptance
    if acc is None:
        parts.append("no draft")
    else:
        rate = f"{100 * acc.rate:.1f} %" if acc.rate is not None else "n/a"
        mean = f"{acc.mean_len:.2f}" if acc.mean_len is not None else "n/a (server without --metrics)"
        chosen = protocol.BudgetTimings.from_timings(result.timings)
        # a --server's budget: the one the request drafted with (runner.request_budget asks the server first)
        budget = (
            f"budget adaptive (mean {chosen.mean:.2f}, {chosen.zero} of {chosen.steps} steps without a draft)"
            if chosen.mean is not None
            else f"budget {result.budget}"
            if result.budget
            else "budget set by the server"
        )
        parts += [
            budget,
            f"drafted {acc.drafted}",
            f"accepted {acc.accepted} ({rate})",
            f"mean acceptance length {mean}",
        ]
        if result.acceptance_kind:
            parts.append(result.acceptance_kind)
    return " | ".join(parts)


def prompt_and_images(args: list[str]) -> tuple[str, list[Path]]:
    """The last argument is the prompt, those before it images; a last argument that names an image is a
    forgotten or misplaced prompt, said in one line (it was sent as the question, with no image)."""
    prompt, images = args[-1], args[:-1]
    if names_an_image(prompt):
        if not images:
            raise UsageError(
                f'no prompt: {prompt} is an image; give the prompt after it: dspark run {prompt} "PROMPT"'
            )
        texts = [a for a in images if not names_an_image(a)]
        order = shlex.join([*(a for a in args if names_an_image(a)), *(texts or ["PROMPT"])])
        raise UsageError(f"the prompt comes last, after the images: dspark run {order}")
    return prompt, [Path(a) for a in images]


@contextlib.contextmanager
def _answer_line_ended(line: dict[str, bool]) -> Iterator[None]:
    """An interrupted or failed stream ends its line on stdout before the error line: on a terminal the two
    share the screen, and "...a source ofdspark: error: interrupted" read as one word."""
    try:
        yield
    except (KeyboardInterrupt, DsparkError):  # not a closed pipe: there is no line to end there
        if line["open"]:
            sys.stdout.write("\n")
            sys.stdout.flush()
            line["open"] = False
        raise


def run(
    args: Annotated[
        list[str], typer.Argument(metavar="[IMAGE]... PROMPT", help="Images, then the prompt.", show_default=False)
    ],
    image: Annotated[Optional[list[Path]], typer.Option("--image", "-i", help="An image (repeatable).")] = None,
    model: ModelOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    mmproj: MmprojOpt = None,
    draft_key: DraftKeyOpt = None,
    budget: BudgetOpt = None,
    no_draft: NoDraftOpt = False,
    spec: SpecOpt = None,
    p_min: AutoPMinOpt = None,
    category: CategoryOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Tokens to generate.")] = 256,
    temp: Annotated[float, typer.Option("--temp", min=0.0, help="Sampling temperature (0 = greedy).")] = 0.0,
    seed: SeedOpt = SEED,
    ctx: CtxOpt = None,
    system: Annotated[Optional[str], typer.Option("--system", help="System message.")] = None,
    threads: ThreadsOpt = None,
    ngl: NglOpt = None,
    server: Annotated[Optional[str], typer.Option("--server", help="Use a running server (URL) instead.")] = None,
    api_key: ApiKeyOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    rpc: RpcOpt = None,
    split_mode: SplitModeOpt = None,
    tensor_split: TensorSplitOpt = None,
    main_gpu: MainGpuOpt = None,
    draft_device: DraftDeviceOpt = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Then ask plain decoding the same question (a second load) and report the first divergence with the target's top-2 there.",
        ),
    ] = False,
    yes: YesOpt = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    api_key = api_key_from(api_key, api_key_file)
    prompt, positional_images = prompt_and_images(args)
    images = positional_images + list(image or [])

    line = {"open": False}  # the answer's last line not ended yet: a status line after it starts on its own

    def on_text(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
        line["open"] = True

    def on_status(msg: str) -> None:
        on_progress.finish()
        if line["open"]:  # --compare's second load comes after the streamed answer
            sys.stdout.write("\n")
            sys.stdout.flush()
            line["open"] = False
            line["ended"] = True
        err.print(f"[dim]{msg}[/dim]")

    question = runner.Question(
        prompt, tuple(load_image(p) for p in images), system=system, max_tokens=max_tokens, temp=temp, seed=seed
    )
    pair = PairSpec(
        model=model,
        target=target,
        draft=draft,
        mmproj=mmproj,
        draft_key=draft_key,
        no_draft=no_draft,
        speculation=speculation.parse(spec) if spec else None,
    )
    knobs = ServerKnobs(
        **knob_values(budget, p_min),
        ctx=ctx,
        threads=threads,
        ngl=ngl,
        extra_args=passthrough_args(),
        api_key=api_key,
        category=category,
        placement=placement_of(rpc, split_mode, tensor_split, main_gpu, draft_device),
    )
    with download_progress(disable=json_out) as on_progress, _answer_line_ended(line):
        result = runner.answer(
            question,
            pair,
            knobs,
            Downloads(
                yes=yes,
                confirm=confirm_downloads,
                on_progress=on_progress,
                on_notice=lambda m: err.print(m, markup=False),
            ),
            server_url=server,
            llama_bin=llama_bin,
            on_text=None if json_out else on_text,
            on_status=None if json_out else on_status,
            on_notice=lambda msg: err.print(msg, markup=False),
            compare=compare,
        )
    if json_out:
        print_json(result.to_record())
        return
    if not line.get("ended"):
        sys.stdout.write("\n")
        sys.stdout.flush()
    err.print(format_stats(result), markup=False)
    if result.comparison is not None:
        err.print(result.comparison.message(), markup=False)


def register(app: typer.Typer) -> None:
    app.command("run", help=HELP)(run)
