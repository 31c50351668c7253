"""`dspark fetch NAME`: download a registry pair (target, mmproj, draft) and verify every byte."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import FetchDraftOpt, JsonOpt, LlamaBinOpt, YesOpt
from dsparkcli.cli._download import ask_to_download, download_progress, show_plan
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.errors import EngineNotFoundError, Interrupted, UsageError
from dsparkcli.gguf.analysis import printable
from dsparkcli.hub import fetch as hub
from dsparkcli.hub.registry import load_registry
from dsparkcli.llama.engine import resolve_engine
from dsparkcli.pairs import engine_check

HELP = """Download a model pair from the Hugging Face hub and verify it (size and sha256).

Files go to the HF cache (HF_HOME) or to --dir. An interrupted download resumes where it
stopped on the next run. Asks before downloading more than 1 GB unless --yes. Honours HF_TOKEN
(gated repos), HF_HUB_OFFLINE and HF_ENDPOINT.

Before any download, the GGUF headers of the files are read from the hub (HTTP range requests,
header bytes only) and checked against the llama.cpp engine in use (`dspark doctor`): a model arch,
vision projector type or tensor type it cannot load stops the fetch, unless --force.

\b
Examples:
  dspark fetch minicpm-v-4.7                     # target + mmproj + default draft
  dspark fetch minicpm-v-4.7 --draft nvfp4a16-q8heads --yes
  dspark fetch minicpm-v-4.7 --dir ~/models --json
  dspark fetch hf://owner/repo/model-Q8_0.gguf       # one file, sha256-verified
  dspark fetch minicpm-v-4.7 --force             # download even what this engine cannot load
"""


def fetch(
    name: Annotated[
        Optional[str],
        typer.Argument(
            help="Pair name from `dspark models` (default: the registry's default), or one file: hf://owner/repo[@rev]/file.gguf."
        ),
    ] = None,
    draft: FetchDraftOpt = None,
    local_dir: Annotated[
        Optional[Path], typer.Option("--dir", help="Download into this folder instead of the HF cache.")
    ] = None,
    revision: Annotated[
        Optional[str], typer.Option("--revision", help="Branch, tag or commit for every file of the pair.")
    ] = None,
    yes: YesOpt = False,
    force: Annotated[bool, typer.Option("--force", help="Download even files the engine in use cannot load.")] = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    if name is not None and name.startswith("hf://"):  # one file, as the error hints and --target spell it
        if draft is not None or revision is not None:
            raise UsageError(
                "--draft and --revision are for pair names; write the revision as hf://owner/repo@REV/file"
            )
        with download_progress(disable=json_out) as on_progress:
            path = hub.fetch_ref(name, local_dir=local_dir, yes=yes, on_progress=on_progress, confirm=ask_to_download)
        if json_out:
            print_json({"name": name, "path": path})
        else:
            out.print(f"file    {path}", markup=False)
        return
    pair = load_registry().get(name)
    planned = hub.plan(pair, draft, local_dir=local_dir, revision=revision)
    if not json_out:
        show_plan(planned)
    check = None
    if not force:
        try:
            engine = resolve_engine(llama_bin)
        except EngineNotFoundError:
            engine = None  # fetching for another machine is fine: the files are checked where they are run
            if not json_out:
                err.print("note: no llama.cpp engine here, so the files are not checked against one")
        if engine is not None:
            advice = (
                None
                if json_out
                else (lambda c: err.print(f"warning: {printable(c.file, 80)}: {c.detail}", markup=False))
            )
            check = engine_check(
                engine, after="--force downloads them anyway", on_advice=advice, build=pair.engine_build
            )
            hub.check_before_download(planned, check)
    hub.confirm_large(
        planned, pair.name, yes=yes, confirm=lambda p: ask_to_download(p, show=False)
    )  # the plan is shown above
    with download_progress(disable=json_out) as on_progress:
        try:
            fetched = hub.fetch_planned(planned, pair.name, on_progress=on_progress, check=check)
        except KeyboardInterrupt:
            raise Interrupted(hub.interrupted(planned)) from None  # what is kept, as it is: maybe nothing
    if json_out:
        print_json({"name": pair.name, "files": fetched})
        return
    for f in fetched:
        source = f"sha256 ok ({f.sha256_source})" if f.sha256 else "git blob id ok"
        out.print(f"{f.role:<7} {f.action:<10} {source}  {f.path}")


def register(app: typer.Typer) -> None:
    app.command("fetch", help=HELP)(fetch)
