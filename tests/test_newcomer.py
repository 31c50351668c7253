"""What a new user hit on a first try (issue 28, "what a new user hit besides"): each as the user met it,
`dspark` in a subprocess, with the real engine wherever llama-server is involved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsparkcli.synth import known_answer as synth


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=9)


def _error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------------ item 10: bare `dspark` shows its help


@pytest.mark.parametrize(
    ("args", "usage", "listed"),
    [
        ([], "Usage: dspark [OPTIONS] COMMAND", "  distill "),
        (["engine"], "Usage: dspark engine [OPTIONS]", "  build "),
    ],
)
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
    server.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --version) echo "version: 4242 (build x, commit abc1234)" >&2 ;;\n'
        '  --help) echo "--spec-type [none|draft-simple|draft-eagle3|ngram-simple]"\n'
        '          echo "    none,draft-simple,draft-eagle3,ngram-simple" ;;\n'
        f'  *) echo "$@" >> {started}; exit 1 ;;\n'
        "esac\n"
    )
    server.chmod(0o755)
    return server, started


@pytest.mark.parametrize("command", [["run", "hello", "-n", "4"], ["serve", "--port", "0"]])
def test_run_and_serve_refuse_an_engine_without_draft_dspark_before_starting_it(cli, pair, tmp_path, command):
    server, started = _stock_server(tmp_path)
    proc = cli(
        *command, "--target", str(pair.target), "--draft", str(pair.draft), "--llama-bin", str(server), timeout=60
    )
    assert proc.returncode == 3, proc.stderr  # as doctor and bench: the engine cannot do it (not a crash, 4)
    line = _error_line(proc)
    assert (
        f"{server} has no 'draft-dspark' in --spec-type (found: none,draft-simple,draft-eagle3,ngram-simple)" in line
    )
    assert "dspark engine build" in line
    assert not started.exists()  # refused up front: never launched with the pair


# ------------------------------------------------------------------ item 4: llama-server refuses an argument


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        ("-ngl", 'error while handling argument "-ngl": expected value'),
        ("--no-such-flag", "error: invalid argument: --no-such-flag"),
    ],
)
def test_an_argument_llama_server_refuses_is_named(cli, engine, pair, extra, cause):
    proc = cli(
        "run",
        "hi",
        "--target",
        str(pair.target),
        "--no-draft",
        "-t",
        "1",
        "--ctx",
        "256",
        "--llama-bin",
        str(engine.server),
        "--",
        extra,
        timeout=120,
    )
    assert proc.returncode == 4, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    # the log's first line, not the "to show complete usage, run with -h" the usage it prints ends with
    assert line.startswith(
        f"dspark: error: llama-server failed during start (exit code 1): llama-server refused an argument: {cause}"
    ), proc.stderr
    assert "to show complete usage" not in proc.stderr


# ------------------------------------------------------------------ item 6: a reader that quits


def _processes_with(text: str) -> list[str]:
    """Command lines of the running processes that mention ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline:
            found.append(cmdline)
    return found


def test_run_into_a_pipe_whose_reader_quit_ends_quietly_with_141(engine, pair):
    """`dspark run ... | head -1`: the answer is streamed into a pipe nobody reads any more. The pipe is real
    (its read end closed before the first token, so the write that fails is the answer's, every time)."""
    read, write = os.pipe()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsparkcli.cli.app",
            "run",
            "List ten fruits",
            "--target",
            str(pair.target),
            "--draft",
            str(pair.draft),
            "-t",
            "1",
            "--ctx",
            "256",
            "-n",
            "64",
            "--llama-bin",
            str(engine.server),
        ],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write)
    os.close(read)  # the reader quits
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141, stderr  # as a tool killed by SIGPIPE (README); it was a silent 1
    said = stderr.strip().splitlines()  # the status line, and nothing else: no error, no traceback
    assert len(said) == 1 and said[0].startswith("loading target-llama.gguf + draft draft-dspark.gguf"), stderr
    assert _processes_with(str(pair.target)) == []  # its llama-server was stopped: no orphan
