"""A first interactive session: streamed text on a terminal, pipes that close, bad hub addresses, hints that
work, verdicts that mean something. Run as a user would (`dspark` in a subprocess, a pty where it matters)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dsparkcli.synth import known_answer as synth
from support.cli import REPO
from support.terminal import on_a_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=9)


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("dspark: error: "), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return lines[-1]


# ------------------------------------------------------------------ item 1: streamed text on a terminal


def test_streamed_answer_on_a_terminal_is_one_text_not_a_line_per_token(cli, engine, pair):
    args = ["run", "--target", str(pair.target), "--no-draft", "-t", "1", "--ctx", "256", "-n", "24", "Say hi"]
    piped = cli(*args)
    assert piped.returncode == 0, piped.stderr
    text = piped.stdout.rstrip("\n")
    assert len(text) > 20 and "\n" not in text  # the synthetic pair's answer is one line
    rc, shown = on_a_terminal(args)
    assert rc == 0, shown
    screen = ANSI.sub("", shown).replace("\r\n", "\n")
    # the answer arrives piece by piece, yet on the terminal it reads as the one line a pipe receives
    assert text in screen.split("\n"), screen


# ------------------------------------------------------------------ item 6: no tracebacks


@pytest.mark.parametrize(
    "ref",
    [
        "hf://own er/repo/x.gguf",
        "hf://../repo/x.gguf",
        "hf://owner/re..po/x.gguf",
        f"hf://{'o' * 97}/repo/x.gguf",
        "hf://owner/repo/../x.gguf",
    ],
)
def test_bad_hub_addresses_are_one_line(cli, ref):
    # refused before the hub is asked or an engine looked for (no HF_HUB_OFFLINE needed: nothing goes out)
    for args in (["inspect", ref], ["run", "--target", ref, "hi"]):
        proc = cli(*args)
        assert proc.returncode == 2
        assert "bad hub address" in _one_error_line(proc)


def test_closed_stdout_is_no_traceback(engine, pair):
    for args in (
        ["run", "--target", str(pair.target), "--no-draft", "-t", "1", "--ctx", "256", "-n", "8", "hi"],
        ["inspect", str(pair.draft)],
        ["models"],
        ["--help"],
    ):
        proc = subprocess.run(
            f"{sys.executable} -m dsparkcli.cli.app {' '.join(args)} >&-",
            shell=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_a_reader_that_quits_ends_every_command_quietly(pair):
    # `| head -1`: the reader closes the pipe while dspark still writes
    for args in (
        ["inspect", str(pair.draft), str(pair.target)],
        ["models"],
        ["--help"],
        ["synth-predict", str(pair.manifest), "--prompt-tokens", ",".join(["1"] * 2000)],
    ):
        proc = subprocess.run(
            f"{sys.executable} -m dsparkcli.cli.app {' '.join(args)} | head -c 1 >/dev/null; "
            'echo "rc=${PIPESTATUS[0]}" >&2',
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            cwd=REPO,
        )
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
    cfg = user_models("""
[pairs.toy]
target = { repo = "o/t", filename = "t.gguf" }
drafts.q8 = { repo = "o/d", filename = "other-name.gguf" }
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


# ------------------------------------------------------------------ item 10f: the default pair is announced


DEFAULT_PAIR = """
default = "bigpair"
[pairs.bigpair]
description = "a stand-in for the 20 GB default"
budget = 3
[pairs.bigpair.target]
repo = "o/t"
filename = "target-llama.gguf"
[pairs.bigpair.drafts.q8]
repo = "o/d"
filename = "draft-dspark.gguf"
"""
SMALL = "--model smollm2-135m (115.4 MB) to try a small pair"  # the packaged registry's smallest sized pair


@pytest.fixture
def default_hub(engine, pair, tmp_path, user_models):
    """A local hub holding the default pair's files (the real huggingface_hub client talks to it)."""
    from support.hubserver import FakeHub

    with FakeHub() as hub:
        hub.add_file("o/t", "target-llama.gguf", pair.target.read_bytes())
        hub.add_file("o/d", "draft-dspark.gguf", pair.draft.read_bytes())
        env = {
            **hub.client_env(tmp_path / "hf"),
            "DSPARK_LLAMA_BIN": str(engine.bin_dir),
            "DSPARK_CONFIG_DIR": str(user_models(DEFAULT_PAIR)),
            "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        }
        yield hub, env


def _file_downloads(hub) -> list:
    """Whole-file GETs (the engine check before a download reads headers only, with Range)."""
    return [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path and r.range is None]


def test_default_pair_is_named_with_its_size_before_anything_is_downloaded(cli, default_hub, pair):
    hub, env = default_hub
    size = pair.target.stat().st_size + pair.draft.stat().st_size
    proc = cli("run", "hello", "-n", "8", "-t", "1", "--ctx", "256", env=env, input="")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        f"no --model or --target: the default pair bigpair (a stand-in for the 20 GB default); "
        f"{size / 1e6:.1f} MB to download from the hub (or {SMALL})"
    ), proc.stderr
    assert proc.stdout.strip()  # and then it answered, from the downloaded files
    again = cli("run", "hello", "-n", "8", "-t", "1", "--ctx", "256", env=env, input="")
    assert again.stderr.splitlines()[0].endswith("; its files are here"), again.stderr


def test_a_big_default_pair_is_refused_without_a_terminal(cli, default_hub):
    hub, env = default_hub
    hub.advertise_size("o/t", "target-llama.gguf", 20 * 10**9)
    proc = cli("run", "hello", env=env, input="")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        lines[0].startswith("no --model or --target: the default pair bigpair") and "20.0 GB to download" in lines[0]
    )
    assert lines[-1] == (
        f"dspark: error: bigpair needs 20.0 GB of downloads and stdin is not a terminal; pass --yes, or {SMALL}"
    ), proc.stderr
    assert len(lines) == 2 and not _file_downloads(hub)


@pytest.mark.parametrize("command", [["bench", "-n", "4"], ["tune"], ["serve"]])
def test_every_serving_command_names_the_default_pair_before_refusing_it(cli, default_hub, command):
    """issue 28, item 10: bare bench/tune/serve were said to go for the default pair without run's notice;
    they share run's path (pairs.resolve_files): the same first line, the same small pair offered."""
    hub, env = default_hub
    hub.advertise_size("o/t", "target-llama.gguf", 20 * 10**9)
    proc = cli(*command, env=env, input="")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == (
        "no --model or --target: the default pair bigpair (a stand-in for the 20 GB default); "
        f"20.0 GB to download from the hub (or {SMALL})"
    ), proc.stderr
    assert lines[-1].startswith("dspark: error: bigpair needs 20.0 GB of downloads") and lines[-1].endswith(SMALL)
    assert len(lines) == 2 and not _file_downloads(hub)


def test_a_big_default_pair_is_asked_for_on_a_terminal(default_hub):
    hub, env = default_hub
    hub.advertise_size("o/t", "target-llama.gguf", 20 * 10**9)
    rc, shown = on_a_terminal(["run", "hello"], env=env, answer=(b"Download 20.0 GB?", b"n\n"))
    screen = ANSI.sub("", shown).replace("\r\n", "\n")
    assert rc == 1, screen
    assert (
        screen.index("the default pair bigpair")
        < screen.index("target-llama.gguf  20.0 GB")
        < screen.index("Download 20.0 GB?")
    )  # named, then the plan, then the question
    assert "dspark: error: fetch of bigpair cancelled; nothing was downloaded" in screen
    assert not _file_downloads(hub)
