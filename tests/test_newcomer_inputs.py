"""Each bad input of issue 40's table answered as a user expects: one `dspark: error:` line (or a warning),
the exit code of a usage error (2) before any engine is looked for, and nothing started or written."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from dsparkcli.synth import known_answer as synth
from support.cli import default_sigint
from support.gguf_fixtures import write_target


def _one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The whole of stderr: one `dspark: error:` line, nothing before it, the given exit code."""
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: "), proc.stderr
    return lines[0].removeprefix("dspark: error: ")


@pytest.fixture
def no_engine(tmp_path: Path) -> dict[str, str]:
    """A machine with no engine built: an empty cache and config, no DSPARK_LLAMA_BIN, a PATH without
    llama-server. A usage error must come first there, not "no llama.cpp engine found" (rc 3)."""
    return {
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
        "DSPARK_CONFIG_DIR": str(tmp_path / "config"),
        "DSPARK_LLAMA_BIN": "",
        "PATH": "/usr/bin:/bin",
    }


@pytest.fixture
def good_png(tmp_path: Path) -> Path:
    path = tmp_path / "good.png"
    Image.new("RGB", (16, 16), "red").save(path)
    return path


# ------------------------------------------------------------------ run: the prompt forgotten or misplaced


def test_run_with_an_image_and_no_prompt_is_a_usage_error(cli, tmp_path, good_png, no_engine):
    """It ran with the file's name as the prompt and no image sent (rc 0)."""
    files = []
    for name in ("t.gguf", "d.gguf", "mm.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
        files.append(str(tmp_path / name))
    t, d, m = files
    proc = cli("run", str(good_png), "--target", t, "--draft", d, "--mmproj", m, env=no_engine)
    assert _one_line(proc, 2) == (
        f'no prompt: {good_png} is an image; give the prompt after it: dspark run {good_png} "PROMPT"'
    )
    assert proc.stdout == ""


def test_run_with_the_prompt_before_the_image_says_the_prompt_comes_last(cli, good_png, no_engine):
    """It said "image not found: Describe"."""
    proc = cli("run", "Describe it", str(good_png), "--model", "smollm2-135m", env=no_engine)
    assert _one_line(proc, 2) == f"the prompt comes last, after the images: dspark run {good_png} 'Describe it'"


def test_a_prompt_that_mentions_an_image_is_still_a_prompt(cli, good_png):
    """Only a last argument that is an image's name is refused: a sentence naming one is a prompt. (Port 9
    has no server: the image is read and the prompt accepted before the connection fails.)"""
    proc = cli("run", str(good_png), "What is in good.png?", "--server", "http://127.0.0.1:9")
    assert "could not connect" in _one_line(proc, 4)


# ------------------------------------------------------------------ run: the default pair with no hub in reach

VISION_DEFAULT = """
default = "bigpair"
[pairs.bigpair]
description = "a stand-in for the hub-only default"
[pairs.bigpair.target]
repo = "o/t"
filename = "target.gguf"
[pairs.bigpair.mmproj]
repo = "o/t"
filename = "mmproj.gguf"
[pairs.bigpair.drafts.q8]
repo = "o/d"
filename = "draft.gguf"
"""
# the packaged registry's smallest pair whose files come from PyPI and dspark itself
OFF_HUB = "or, without the hub: --model smollm2-135m (115.4 MB from PyPI, not the hub; text only"


def test_the_default_pair_without_a_hub_suggests_the_pair_that_needs_none(
    cli, engine, tmp_path, good_png, user_models
):
    """README's first example with no hub in reach said "set HF_HUB_OFFLINE=1", and that said "run `dspark
    fetch minicpm-v-4.7` with network access first": both needed the hub. The line names a pair that does not."""
    from support.hubserver import FakeHub

    with FakeHub() as gone:
        env = gone.client_env(tmp_path / "hf")  # a port nobody listens on once this block ends
    env |= {
        "DSPARK_LLAMA_BIN": str(engine.bin_dir),
        "DSPARK_CONFIG_DIR": str(user_models(VISION_DEFAULT)),
        "DSPARK_CACHE_DIR": str(tmp_path / "cache"),
    }
    question = [str(good_png), "What is in this picture?"]
    line = _one_line(cli("run", *question, env=env, input=""), 5)
    assert line == (
        f"cannot reach {gone.endpoint} for o/t (ConnectError) and the target target.gguf of bigpair is not cached; "
        f"check the network; {OFF_HUB})"
    )  # no HF_HUB_OFFLINE=1: nothing here for it to serve
    offline = _one_line(cli("run", *question, env={**env, "HF_HUB_OFFLINE": "1"}, input=""), 5)
    assert offline == (
        "offline (HF_HUB_OFFLINE) and the target target.gguf of bigpair is not in the HF cache; run `dspark fetch "
        f"bigpair` with network access first; {OFF_HUB}; unset HF_HUB_OFFLINE to fetch it)"
    )  # smollm2-135m's wheel is not cached either, and offline nothing is fetched from PyPI
    # followed with the image still there: said before anything is fetched (it came after the download)
    proc = cli("run", *question, "--model", "smollm2-135m", env=env, input="")
    assert _one_line(proc, 2) == "images given but smollm2-135m is a text pair (no vision projector); ask without them"
    assert not (tmp_path / "cache" / "pypi").exists()
    # a pair the user named is theirs: no other pair is offered instead
    named = _one_line(cli("run", *question, "--model", "bigpair", env=env, input=""), 5)
    assert named.endswith("is not cached; check the network"), named


# ------------------------------------------------------------------ run / serve: --no-draft with a draft's tuning


@pytest.mark.parametrize(
    ("command", "tuning", "said"),
    [
        (["run", "hi", "--model", "smollm2-135m"], ["--budget", "3"], "--budget"),
        (["run", "hi", "--model", "smollm2-135m"], ["--budget", "auto", "--p-min", "0.2"], "--budget and --p-min"),
        (["run", "hi", "--server", "http://127.0.0.1:9"], ["--budget", "3"], "--budget"),
        (["serve", "smollm2-135m"], ["--p-min", "auto"], "--p-min"),
    ],
)
def test_no_draft_with_a_budget_is_refused_not_ignored(cli, no_engine, command, tuning, said):
    """`--budget` was silently ignored; now refused, before the engine is looked for."""
    proc = cli(*command, "--no-draft", *tuning, env=no_engine)
    assert _one_line(proc, 2) == f"--no-draft and {said}: plain decoding has no draft to tune; drop one"


# ------------------------------------------------------------------ inspect: placement and context


def test_inspect_draft_device_without_tensor_split_names_the_missing_option(cli, tmp_path):
    """It said "not one of the 0 devices of --tensor-split"."""
    target = write_target(tmp_path / "t.gguf")
    proc = cli("inspect", str(target), "--draft-device", "3")
    assert _one_line(proc, 2) == "--draft-device needs --tensor-split (it names one of the split's devices)"


def test_inspect_past_the_models_context_warns(cli, tmp_path):
    """-c 99999999999 printed terabytes of KV cache for the model's 262144-token context without a word."""
    target = write_target(tmp_path / "t.gguf")  # context_length 262144
    past = cli("inspect", str(target), "-c", "99999999999")
    assert past.returncode == 0, past.stderr
    assert past.stderr.splitlines() == [
        f"warning: -c 99999999999 is past the 262144-token context {target} was trained for (context_length); "
        "llama-server runs it, but answers past 262144 tokens degrade"
    ]
    assert "KV at 99999999999 tokens" in past.stdout  # the estimate still stands
    as_json = cli("inspect", str(target), "-c", "300000", "--json")
    assert as_json.returncode == 0 and "warning: -c 300000 is past" in as_json.stderr
    assert json.loads(as_json.stdout)["files"][0]["memory"]["trained_ctx"] == 262144
    within = cli("inspect", str(target), "-c", "262144")
    assert within.returncode == 0 and within.stderr == ""


# ------------------------------------------------------------------ the engine named by the variable


def test_a_missing_engine_from_dspark_llama_bin_names_the_variable(cli, tmp_path):
    """It said "(from --llama-bin)", an option the user never gave."""
    nowhere = str(tmp_path / "nonexistent")
    proc = cli("doctor", env={"DSPARK_LLAMA_BIN": nowhere})
    assert _one_line(proc, 3).startswith(f"llama-server not found: {nowhere} (from DSPARK_LLAMA_BIN)")
    given = cli("doctor", "--llama-bin", nowhere)
    assert _one_line(given, 3).startswith(f"llama-server not found: {nowhere} (from --llama-bin)")


# ------------------------------------------------------------------ fetch and models: names and folders


@pytest.mark.parametrize("name", ["", "  "])
def test_fetch_an_empty_name_is_refused_not_the_default_pair(cli, tmp_path, no_engine, name):
    """`dspark fetch ""` (an unset shell variable) fetched the default pair."""
    proc = cli("fetch", name, "--dir", str(tmp_path / "models"), "--yes", env=no_engine)
    assert _one_line(proc, 2) == "empty model name: name a pair from `dspark models`, or none for the default"
    assert not (tmp_path / "models").exists()


def test_models_dir_that_does_not_exist_says_so(cli, tmp_path):
    """It listed every file as "missing", rc 0."""
    nowhere = tmp_path / "nonexistent"
    assert _one_line(cli("models", "--dir", str(nowhere)), 2) == f"--dir {nowhere}: no such folder"
    (tmp_path / "file").write_text("x")
    assert _one_line(cli("models", "--dir", str(tmp_path / "file")), 2) == f"--dir {tmp_path / 'file'}: not a folder"
    assert cli("models", "--dir", str(tmp_path)).returncode == 0  # a folder with nothing in it is fine


# ------------------------------------------------------------------ serve: the port, and what to ask it with


def test_serve_on_a_port_in_use_says_so_before_loading(cli, tmp_path, no_engine):
    """It loaded the model, then failed with rc 4. Now the port is checked first: here no engine is even
    looked for (there is none) and the target is never read."""
    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("serve", "--target", str(target), "--port", str(port), env=no_engine)
    assert _one_line(proc, 4) == f"port {port} on 127.0.0.1 is in use: give another --port (0 picks a free one)"


def _ask_line(engine, pair, *files: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", "serve", *files, "--port", "0", "-t", "1", "--ctx", "256"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DSPARK_LLAMA_BIN": str(engine.server)},
    )
    try:
        line = next((line for line in iter(proc.stdout.readline, "") if line.startswith("ask it:")), "")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert line, proc.stderr.read()
    return line


def test_serve_suggests_no_image_for_a_text_pair(engine, tmp_path):
    """It suggested `dspark run --server URL IMAGE "PROMPT"` for a text-only pair."""
    pair = synth.write_pair(tmp_path / "pair", vocab=64, seed=9)
    line = _ask_line(engine, pair, "--target", str(pair.target), "--draft", str(pair.draft))
    assert re.fullmatch(r'ask it:  dspark run --server http://127\.0\.0\.1:\d+ "PROMPT"   \(Ctrl-C stops\)\n', line)


# ------------------------------------------------------------------ bench: usage before the engine, outputs kept


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--budget", "abc"], "--budget must be a number, 'auto' or 'adaptive' (got 'abc')"),
        (["--budget", "0"], "--budget must be >= 1 (got 0)"),
        (["--budget", "5", "5"], "--budget values must be distinct (5 is given twice)"),
        (["--model", "nosuch"], "unknown model 'nosuch' in the registry; known: "),
    ],
)
def test_bench_usage_errors_come_before_the_engine_check(cli, no_engine, args, said):
    """With no engine built these said "no llama.cpp engine found" (rc 3), as `--category nosuch` did not."""
    assert _one_line(cli("bench", *args, env=no_engine), 2).startswith(said)


def test_bench_out_refuses_a_file_that_is_not_dspark_jsonl(cli, tmp_path, no_engine):
    """JSONL was appended to a text file, rc 0. Refused before the run; --force appends anyway (here the run
    then stops at the missing engine, past the check); a file of dspark records is appended to, as ever."""
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    proc = cli("bench", "--out", str(notes), env=no_engine)
    assert _one_line(proc, 2) == (
        f"--out {notes}: its first line is not JSON, and bench appends JSONL records (pass --force to anyway)"
    )
    other = tmp_path / "other.jsonl"
    other.write_text('{"question_id": 81}\n')
    assert "is not a record of dspark's (no 'record' or 'run_id')" in _one_line(cli("bench", "--out", str(other)), 2)
    assert notes.read_text() == "notes\n" and other.read_text() == '{"question_id": 81}\n'
    assert "no llama.cpp engine found" in _one_line(cli("bench", "--out", str(notes), "--force", env=no_engine), 3)
    ours = tmp_path / "ours.jsonl"
    ours.write_text('{"record": "prompt", "run_id": "r1"}\n')
    assert "no llama.cpp engine found" in _one_line(cli("bench", "--out", str(ours), env=no_engine), 3)


def test_bench_plot_refuses_to_replace_an_existing_png(cli, tmp_path, good_png, no_engine):
    """The PNG was overwritten silently; one --force covers --out and --plot."""
    before = good_png.read_bytes()
    proc = cli("bench", "--plot", str(good_png), env=no_engine)
    assert _one_line(proc, 2) == f"--plot exists: {good_png} (pass --force to replace it)"
    assert good_png.read_bytes() == before
    assert "no llama.cpp engine found" in _one_line(cli("bench", "--plot", str(good_png), "--force", env=no_engine), 3)


# ------------------------------------------------------------------ run: Ctrl-C mid-stream


def test_ctrl_c_during_a_streamed_answer_ends_its_line_first(engine, tmp_path):
    """It printed "...a source ofdspark: error: interrupted": the answer's line was left open."""
    pair = synth.write_pair(tmp_path / "pair", vocab=64, seed=9)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", "run", "List ten fruits", "--target", str(pair.target)]
        + ["--draft", str(pair.draft), "-t", "1", "--ctx", "512", "-n", "400", "--llama-bin", str(engine.server)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        first = proc.stdout.read(1)  # the answer has begun
        proc.send_signal(signal.SIGINT)
        rest, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first and proc.returncode == 130, stderr
    assert (first + rest).endswith("\n") and stderr.splitlines()[-1] == "dspark: error: interrupted"
