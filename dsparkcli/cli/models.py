"""`dspark models`: the registry, and which of its files are present locally."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import JsonOpt
from dsparkcli.cli._output import out, print_json
from dsparkcli.errors import UsageError
from dsparkcli.hub import fetch as hub
from dsparkcli.hub.model_file import ModelFile
from dsparkcli.hub.registry import ModelPair, load_registry
from dsparkcli.units import format_size

HELP = """List the model pairs dspark knows and what is already downloaded.

Pairs come from the packaged models.toml and your own models.toml in the dspark config folder
(same schema; a pair of the same name replaces the packaged one). Presence is checked in the HF
cache (HF_HOME) or in --dir, without network.

\b
Examples:
  dspark models
  dspark models --dir ~/models
  dspark models --json
"""

DirOpt = Annotated[Optional[Path], typer.Option("--dir", help="Look in this folder instead of the HF cache.")]


def models(local_dir: DirOpt = None, json_out: JsonOpt = False) -> None:
    if local_dir is not None and not local_dir.is_dir():  # else every file reads "missing", rc 0
        raise UsageError(
            f"--dir {local_dir}: no such folder" if not local_dir.exists() else f"--dir {local_dir}: not a folder"
        )
    registry = load_registry()
    listing = []
    for name, pair in registry.pairs.items():
        files = []
        for role, key, f in _files(pair):
            present = hub.local_status(pair, key if role == "draft" else None, local_dir=local_dir)[role]
            files.append({
                "role": role, "key": key, "source": f.source, "repo": f.repo, "revision": f.revision, "filename": f.filename,
                "glob": f.glob, "size": f.size, "sha256": f.sha256, "census": f.census,
                "present": present is not None, "path": present,
            })  # fmt: skip
        listing.append({
            "name": name, "default": name == registry.default, "description": pair.description,
            "budget": pair.budget, "default_draft": pair.default_draft, "flags": list(pair.flags),
            "acceptance": pair.acceptance, "source": pair.source, "files": files, "classic_draft": pair.classic_draft,
        })  # fmt: skip
    if json_out:
        print_json({"default": registry.default, "pairs": listing})
        return
    for entry in listing:
        mark = " (default)" if entry["default"] else ""
        out.print(f"[bold]{entry['name']}[/bold]{mark}  budget {entry['budget']}  {entry['description']}".rstrip())
        for f in entry["files"]:
            role = f["role"] if f["role"] != "draft" else f"draft {f['key']}"
            role += " *" if f["role"] == "draft" and f["key"] == entry["default_draft"] else ""
            state = "present" if f["present"] else "missing"
            where = f["path"] if f["present"] else f"{f['repo']}/{f['filename'] or f['glob']}"
            out.print(f"  {role:<24} {state:<8} {format_size(f['size']):>9}  {where}")
        if not entry["default_draft"]:
            out.print(
                "  no DSpark draft"
                + (f"; classic draft model: the pair {entry['classic_draft']}" if entry["classic_draft"] else ""),
                markup=False,
            )
        out.print("")
    out.print("* default draft. Fetch with `dspark fetch NAME [--draft KEY]`.")


def _files(pair: ModelPair) -> Iterator[tuple[str, str | None, ModelFile]]:
    yield "target", None, pair.target
    if pair.mmproj is not None:
        yield "mmproj", None, pair.mmproj
    for key, f in pair.drafts.items():
        yield "draft", key, f


def register(app: typer.Typer) -> None:
    app.command("models", help=HELP)(models)
