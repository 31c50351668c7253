"""Each CLI option is declared once (cli/_common.py) with one default, so a flag means the same in every
command that takes it (issue 29): bench's --ctx 4096 beside tune's none was one cause of a key mismatch."""

from __future__ import annotations

import re
from typing import Any

import typer

from dsparkcli.cli import app as cli_app
from support.cli import REPO

SHARED = (
    "--seed",
    "--ctx",
    "--prompts",
    "--limit",
    "--reps",
    "--warmup",
    "--n-predict",
    "--ignore-eos",
    "--draft",
    "--p-min",
    "--category",
    "--synth-len",
    "--host",
    "--port",
    "--threads",
    "--yes",
    "--block-size",
    "--model",
    "--target",
    "--mmproj",
    "--json",
    "--budget",
    "--spec",
)
# the same name for another thing, declared where it is used
OWN_MEANING = {("--prompts", "distill.py")}  # extra training text (a file of lines), not a bench prompt kit


def _commands() -> dict[str, Any]:
    """name -> the click command typer builds (typer vendors click, so its classes are not click's)."""
    group = typer.main.get_command(cli_app.build_app())
    return dict(group.commands)


def _option(cmd: Any, flag: str) -> Any:
    return next((p for p in cmd.params if flag in getattr(p, "opts", ())), None)


def test_shared_options_are_declared_only_in_common():
    declared = {}
    for path in sorted((REPO / "dsparkcli" / "cli").glob("*.py")):
        text = path.read_text()
        for flag in SHARED:
            if re.search(rf'typer\.Option\(\s*"{flag}"', text) and (flag, path.name) not in OWN_MEANING:
                declared.setdefault(flag, []).append(path.name)
    assert {flag: files for flag, files in declared.items() if files != ["_common.py"]} == {}
    assert set(declared) == set(SHARED)


def test_ctx_and_seed_have_one_default_in_every_command():
    commands = _commands()
    ctx_defaults = {name: _option(cmd, "--ctx").default for name, cmd in commands.items() if _option(cmd, "--ctx")}
    seed_defaults = {name: _option(cmd, "--seed").default for name, cmd in commands.items() if _option(cmd, "--seed")}
    assert set(ctx_defaults) >= {"run", "serve", "bench", "tune"}
    assert set(ctx_defaults.values()) == {None}, ctx_defaults  # llama-server's own: the model's trained context
    assert set(seed_defaults) >= {"run", "bench", "tune", "synth", "distill"}
    assert set(seed_defaults.values()) == {0}, seed_defaults
    # and the same help everywhere: one declaration
    assert len({_option(cmd, "--ctx").help for name, cmd in commands.items() if name in ctx_defaults}) == 1
