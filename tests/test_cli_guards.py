"""What a new user hits first: arguments after `--`, outputs that must not replace the wrong thing, secrets,
tracebacks. Each test runs `dspark` as a user would and asserts one line on stderr and the exit code."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama.server import OWNED_FLAGS, ServerConfig


def _one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0]


# ------------------------------------------------------------------ item 2: `--` cannot bypass dspark's checks


@pytest.mark.parametrize(
    ("argv", "flag", "option"),
    [
        (["serve", "--target", "absent.gguf", "--", "--host", "0.0.0.0"], "--host", "--host"),
        (["serve", "--target", "absent.gguf", "--", "--api-key", "k"], "--api-key", "--api-key-file"),
        (["run", "--target", "absent.gguf", "--no-draft", "hi", "--", "--port", "1"], "--port", "--port"),
        (["run", "--target", "absent.gguf", "hi", "--", "-md", "other.gguf"], "-md", "--draft"),
        (["run", "--target", "absent.gguf", "hi", "--", "--spec-draft-n-max=9"], "--spec-draft-n-max", "--budget"),
        (["bench", "--target", "absent.gguf", "--draft", "d.gguf", "--", "-c", "99999"], "-c", "--ctx"),
        (
            ["bench", "--target", "absent.gguf", "--draft", "d.gguf", "--", "--spec-type", "none"],
            "--spec-type",
            "--spec (dspark, ngram-mod",
        ),
        (
            ["bench", "--target", "absent.gguf", "--draft", "d.gguf", "--", "--spec-ngram-mod-n-max", "8"],
            "--spec-ngram-mod-n-max",
            "--spec ngram-mod:n_max=N",
        ),
    ],
)
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
    cfg = ServerConfig(
        model=Path("t.gguf"), draft=Path("d.gguf"), mmproj=Path("m.gguf"), n_max=3, p_min=0.5, synth_len=2.0, ctx=512
    )
    written = {a for a in cfg.argv(Path("llama-server"), 8080) if a.startswith("-")}
    # what dspark sets and checks; -np/--metrics/-t/-ngl are settings dspark does not report on
    assert written - {"-np", "--metrics"} <= set(OWNED_FLAGS)
    with pytest.raises(UsageError, match="--port after `--`"):
        ServerConfig(model=Path("t.gguf"), extra_args=("--port", "1"))


def test_double_dash_on_a_command_that_starts_no_server_is_refused(cli):
    proc = cli("inspect", "x.gguf", "--", "-t", "2")
    assert proc.returncode == 2
    assert "only run, serve, bench, tune start one" in _one_error_line(proc)


# ------------------------------------------------------------------ item 3: outputs are files (or folders), never devices


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dsparkcli.synth import known_answer as synth

    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=5)


def test_check_output_file_refuses_devices_folders_fifos_and_the_input(tmp_path):
    from dsparkcli.outputs import check_output_dir, check_output_file

    src = tmp_path / "in.gguf"
    src.write_bytes(b"x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.gguf"
    link.symlink_to("/dev/full")
    same = tmp_path / "same.gguf"
    same.symlink_to(src)
    for path, words in (
        ("/dev/full", "is a device"),
        (link, "is a device"),
        (tmp_path, "is a directory"),
        (fifo, "is a FIFO"),
        (src, "is the input"),
        (same, "is the input"),
        (tmp_path / "no" / "x.gguf", "does not exist"),
    ):
        with pytest.raises(UsageError, match=words):
            check_output_file(path, inputs=[src])
    with pytest.raises(UsageError, match="exists.*--force"):
        check_output_file(src, replace=False)
    assert check_output_file(tmp_path / "new.gguf", inputs=[src]) == tmp_path / "new.gguf"
    for path, words in (("/dev/null", "is a device"), (src, "is a file"), (fifo, "is a FIFO")):
        with pytest.raises(UsageError, match=words):
            check_output_dir(path)
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and not (tmp_path / "a").exists()


def test_requant_force_never_replaces_a_fifo_a_folder_or_the_input(cli, pair, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    link = tmp_path / "alias.gguf"
    link.symlink_to(pair.draft)
    for out, words in (
        (fifo, "is a FIFO"),
        (tmp_path, "is a directory"),
        (pair.draft, "is the input"),
        (link, "is the input"),
    ):
        proc = cli("requant", str(pair.draft), str(out), "--force")
        assert proc.returncode == 2 and words in _one_error_line(proc), proc.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink()  # untouched


def test_synth_never_writes_through_a_device_or_into_a_file(cli, tmp_path):
    out = tmp_path / "pair"
    out.mkdir()
    (out / "target-llama.gguf").symlink_to("/dev/null")
    proc = cli("synth", str(out))
    assert proc.returncode == 2 and "is a device" in _one_error_line(proc)
    assert (out / "target-llama.gguf").is_symlink() and not (out / "draft-dspark.gguf").exists()
    proc = cli("synth", "/dev/null")
    assert proc.returncode == 2 and "is a device" in _one_error_line(proc)
    # full width (minutes to write): only its refusal is tested, a file given as the folder
    (tmp_path / "file").write_text("")
    proc = cli("synth", str(tmp_path / "file"), "--shape", "minicpm-v-4.7-35b-a3b")
    assert proc.returncode == 2 and "is a file" in _one_error_line(proc)


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--out", "/dev/full", "--out /dev/full is a device"),
        ("--plot", "/unwritable/p.png", "--plot /unwritable/p.png: folder /unwritable does not exist"),
    ],
)
def test_bench_outputs_are_checked_before_the_run(cli, tmp_path, flag, value, words):
    # the target does not exist: the output is refused first, so nothing ran and nothing is lost at the end
    proc = cli("bench", "--target", str(tmp_path / "absent.gguf"), "--draft", "d.gguf", flag, value)
    assert proc.returncode == 2 and words in _one_error_line(proc)


def test_bench_says_a_missing_file_before_looking_for_an_engine(cli, tmp_path, pair):
    # the fast lane has no engine: a typo is still said as the typo (exit 2), not "no llama.cpp engine found"
    for args, words in (
        (["--target", str(tmp_path / "typo.gguf"), "--draft", str(pair.draft)], "target model not found"),
        (["--target", str(pair.target), "--draft", f"q8={tmp_path / 'typo.gguf'}"], "draft model not found"),
        (["--target", str(pair.target), "--draft", "hf://own er/r/d.gguf"], "bad hub address"),
        (["--model", "smollm2-135m", "--mmproj", str(tmp_path / "typo.gguf")], "mmproj model not found"),
    ):
        proc = cli("bench", *args)
        assert proc.returncode == 2 and words in _one_error_line(proc), proc.stderr


def test_fetch_dir_must_be_a_folder(cli, tmp_path):
    (tmp_path / "file").write_text("")
    for path, words in (("/dev/null", "is a device"), (tmp_path / "file", "is a file")):
        proc = cli("fetch", "--dir", str(path))  # refused before the hub is asked
        assert proc.returncode == 2 and words in _one_error_line(proc), proc.stderr
