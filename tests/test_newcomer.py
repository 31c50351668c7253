"""What a new user hit on a first try (issue 28, "what a new user hit besides"): each as the user met it,
`dspark` in a subprocess, with the real engine wherever llama-server is involved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import REPO

from dsparkcli.synth import known_answer as synth


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=9)


def _error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------------ item 10: bare `dspark` shows its help


@pytest.mark.parametrize(("args", "usage", "listed"), [([], "Usage: dspark [OPTIONS] COMMAND", "  distill "),
                                                       (["engine"], "Usage: dspark engine [OPTIONS]", "  build ")])
def test_bare_dspark_prints_its_help_not_an_error_line(cli, args, usage, listed):
    proc = cli(*args)
    assert proc.returncode == 2  # as click's no_args_is_help and `hf` with no command: help, exit 2
    assert proc.stderr.startswith(usage + " "), proc.stderr
    assert "dspark: error" not in proc.stderr and "\nCommands:\n" in proc.stderr
    assert f"\n{listed}" in proc.stderr and proc.stdout == ""  # the commands, one a line
    assert proc.stderr == cli(*args, "--help").stdout  # the very help `--help` prints


# ------------------------------------------------------------------ item 7: an engine without draft-dspark


def _stock_server(tmp_path: Path) -> tuple[Path, Path]:
    """A llama-server whose --help offers no draft-dspark (a stock build); any other start leaves a mark."""
    started = tmp_path / "started"
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text("#!/bin/sh\n"
                      'case "$1" in\n'
                      '  --version) echo "version: 4242 (build x, commit abc1234)" >&2 ;;\n'
                      '  --help) echo "--spec-type [none|draft-simple|draft-eagle3|ngram-simple]"\n'
                      '          echo "    none,draft-simple,draft-eagle3,ngram-simple" ;;\n'
                      f'  *) echo "$@" >> {started}; exit 1 ;;\n'
                      "esac\n")
    server.chmod(0o755)
    return server, started


@pytest.mark.parametrize("command", [["run", "hello", "-n", "4"], ["serve", "--port", "0"]])
def test_run_and_serve_refuse_an_engine_without_draft_dspark_before_starting_it(cli, pair, tmp_path, command):
    server, started = _stock_server(tmp_path)
    proc = cli(*command, "--target", str(pair.target), "--draft", str(pair.draft), "--llama-bin", str(server),
               timeout=60)
    assert proc.returncode == 3, proc.stderr  # as doctor and bench: the engine cannot do it (not a crash, 4)
    line = _error_line(proc)
    assert f"{server} has no 'draft-dspark' in --spec-type (found: none,draft-simple,draft-eagle3,ngram-simple)" in line
    assert "dspark engine build" in line
    assert not started.exists()  # refused up front: never launched with the pair
