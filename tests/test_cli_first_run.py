"""A first interactive session: streamed text on a terminal, pipes that close, bad hub addresses, hints that
work, verdicts that mean something. Run as a user would (`dspark` in a subprocess, a pty where it matters)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
from support.cli import REPO

from dsparkcli.synth import known_answer as synth

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=9)


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("dspark: error: "), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


def _on_a_terminal(args: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run dspark with stdout and stderr on one pty, as in an interactive shell; (exit code, what it showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dsparkcli.cli.app", *args], stdin=slave, stdout=slave,
                            stderr=slave, cwd=REPO, env={**os.environ, "COLUMNS": "200", "TERM": "xterm"})
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the pty
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    rc = proc.wait(timeout=30)
    return rc, b"".join(chunks).decode("utf-8", "replace")


# ------------------------------------------------------------------ item 1: streamed text on a terminal


def test_streamed_answer_on_a_terminal_is_one_text_not_a_line_per_token(cli, engine, pair):
    args = ["run", "--target", str(pair.target), "--no-draft", "-t", "1", "--ctx", "256", "-n", "24", "Say hi"]
    piped = cli(*args)
    assert piped.returncode == 0, piped.stderr
    text = piped.stdout.rstrip("\n")
    assert len(text) > 20 and "\n" not in text  # the synthetic pair's answer is one line
    rc, shown = _on_a_terminal(args)
    assert rc == 0, shown
    screen = ANSI.sub("", shown).replace("\r\n", "\n")
    # the answer arrives piece by piece, yet on the terminal it reads as the one line a pipe receives
    assert text in screen.split("\n"), screen


# ------------------------------------------------------------------ item 6: no tracebacks


@pytest.mark.parametrize("ref", ["hf://own er/repo/x.gguf", "hf://../repo/x.gguf", "hf://owner/re..po/x.gguf",
                                 f"hf://{'o' * 97}/repo/x.gguf", "hf://owner/repo/../x.gguf"])
def test_bad_hub_addresses_are_one_line(cli, ref):
    for args in (["inspect", ref], ["run", "--target", ref, "hi"]):
        proc = cli(*args, env={"HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 2
        assert "bad hub address" in _one_error_line(proc)


def test_closed_stdout_is_no_traceback(engine, pair):
    for args in (["run", "--target", str(pair.target), "--no-draft", "-t", "1", "--ctx", "256", "-n", "8", "hi"],
                 ["inspect", str(pair.draft)], ["models"], ["--help"]):
        proc = subprocess.run(f"{sys.executable} -m dsparkcli.cli.app {' '.join(args)} >&-", shell=True,
                              capture_output=True, text=True, cwd=REPO)
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_a_reader_that_quits_ends_every_command_quietly(pair):
    # `| head -1`: the reader closes the pipe while dspark still writes
    for args in (["inspect", str(pair.draft), str(pair.target)], ["models"], ["--help"], ["synth-predict",
                 str(pair.manifest), "--prompt-tokens", ",".join(["1"] * 2000)]):
        proc = subprocess.run(f"{sys.executable} -m dsparkcli.cli.app {' '.join(args)} | head -c 1 >/dev/null; "
                              "echo \"rc=${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash",
                              capture_output=True, text=True, cwd=REPO)
        lines = proc.stderr.strip().splitlines()
        assert lines[-1] in ("rc=0", "rc=141"), proc.stderr  # as any tool killed by SIGPIPE, or done in time
        assert lines[:-1] == [], proc.stderr  # nothing else said


# ------------------------------------------------------------------ item 7: the fetch hint works


def test_fetch_takes_the_hub_address_the_hints_give(cli, tmp_path):
    proc = cli("fetch", "hf://owner/repo/file.gguf", "--dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1"})
    line = _one_error_line(proc)
    # it looked for that one file (not a pair of that name), and its hint is this same, now working, command
    assert proc.returncode == 5 and "offline" in line and "`dspark fetch hf://owner/repo/file.gguf --dir" in line


# ------------------------------------------------------------------ item 9: no verdict is not success


def test_expect_with_nothing_to_compare_fails(cli, pair, user_models):
    cfg = user_models(f"""
[pairs.toy]
target = {{ repo = "o/t", filename = "t.gguf" }}
drafts.q8 = {{ repo = "o/d", filename = "other-name.gguf" }}
""")
    proc = cli("inspect", str(pair.draft), "--expect", "toy:q8", env={"DSPARK_CONFIG_DIR": str(cfg)})
    assert proc.returncode != 0
    assert "nothing to compare" in _one_error_line(proc)
    assert "matches" not in proc.stdout


def test_two_targets_are_no_verdict_and_no_success(cli, pair):
    proc = cli("inspect", str(pair.target), str(pair.target))
    assert proc.returncode == 1
    assert "no pairing verdict" in _one_error_line(proc)
    proc = cli("inspect", str(pair.draft), str(pair.draft))
    assert proc.returncode == 1 and "no pairing verdict" in _one_error_line(proc)
    assert cli("inspect", str(pair.draft)).returncode == 0  # one file: a description, no pair asked for
