"""What a new user hits first: arguments after `--`, outputs that must not replace the wrong thing, secrets,
tracebacks. Each test runs `dspark` as a user would and asserts one line on stderr and the exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama.server import OWNED_FLAGS, ServerConfig


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------------ item 2: `--` cannot bypass dspark's checks


@pytest.mark.parametrize(("argv", "flag", "option"), [
    (["serve", "--target", "absent.gguf", "--", "--host", "0.0.0.0"], "--host", "--host"),
    (["serve", "--target", "absent.gguf", "--", "--api-key", "k"], "--api-key", "--api-key-file"),
    (["run", "--target", "absent.gguf", "--no-draft", "hi", "--", "--port", "1"], "--port", "--port"),
    (["run", "--target", "absent.gguf", "hi", "--", "-md", "other.gguf"], "-md", "--draft"),
    (["run", "--target", "absent.gguf", "hi", "--", "--spec-draft-n-max=9"], "--spec-draft-n-max", "--budget"),
    (["bench", "--target", "absent.gguf", "--draft", "d.gguf", "--", "-c", "99999"], "-c", "--ctx"),
    (["bench", "--target", "absent.gguf", "--draft", "d.gguf", "--", "--spec-type", "none"], "--spec-type", "--draft"),
])
def test_flags_dspark_owns_are_refused_after_double_dash(cli, argv, flag, option):
    proc = cli(*argv, timeout=60)
    assert proc.returncode == 2
    line = _one_error_line(proc)
    # refused before the (absent) target is even looked at, naming the flag and dspark's own option
    assert f"{flag} after `--`" in line and option in line and "absent.gguf" not in line


def test_flags_dspark_does_not_own_still_pass_through():
    cfg = ServerConfig(model=Path("t.gguf"), extra_args=("-ngl", "99", "-fa", "on", "--spec-draft-n-min", "2"))
    assert cfg.argv(Path("llama-server"), 8080)[-6:] == ["-ngl", "99", "-fa", "on", "--spec-draft-n-min", "2"]


def test_every_flag_server_config_writes_is_owned():
    cfg = ServerConfig(model=Path("t.gguf"), draft=Path("d.gguf"), mmproj=Path("m.gguf"), n_max=3, p_min=0.5,
                       synth_len=2.0, ctx=512)
    written = {a for a in cfg.argv(Path("llama-server"), 8080) if a.startswith("-")}
    # what dspark sets and checks; -np/--metrics/-t/-ngl are settings dspark does not report on
    assert written - {"-np", "--metrics"} <= set(OWNED_FLAGS)
    with pytest.raises(UsageError, match="--port after `--`"):
        ServerConfig(model=Path("t.gguf"), extra_args=("--port", "1"))


def test_double_dash_on_a_command_that_starts_no_server_is_refused(cli):
    proc = cli("inspect", "x.gguf", "--", "-t", "2")
    assert proc.returncode == 2
    assert "only run, serve, bench start one" in _one_error_line(proc)
