"""Checks that come before the work, and checks that check (issue 14 items 8 and 10): one line, exit 2,
nothing loaded. The pair is synthetic: block size 8 (budget at most 8), trained context known."""

from __future__ import annotations

import json

import pytest

from dsparkcli.gguf.analysis import summarize
from dsparkcli.gguf.pairing import open_header
from dsparkcli.synth import known_answer as synth


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=2, vision=True)


def _error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error: ") and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def _run(cli, pair, *extra):
    return cli("run", "--target", str(pair.target), "--draft", str(pair.draft), "-t", "1", *extra, timeout=60)


def test_empty_prompt_is_refused_before_loading(cli, pair):
    proc = _run(cli, pair, "  ")
    assert proc.returncode == 2 and "the prompt is empty" in _error(proc)
    assert "loading" not in proc.stderr


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_context_above_the_trained_one_is_refused(cli, pair):
    trained = summarize(open_header(pair.target)).context
    assert trained
    proc = _run(cli, pair, "--ctx", str(trained * 2), "hi")
    assert proc.returncode == 2
    assert f"--ctx {trained * 2} is above the target's trained context {trained}" in _error(proc)


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_budget_above_the_draft_block_is_refused(cli, pair):
    proc = _run(cli, pair, "--budget", "9", "hi")
    assert proc.returncode == 2 and "--budget 9 is above what the draft proposes per step: at most 8" in _error(proc)


def test_option_parser_errors_are_one_line(cli):
    proc = cli("run", "--max-tokens", "zero", "hi")
    assert proc.returncode == 2
    line = _error(proc)
    assert "--max-tokens" in line and "dspark run --help" in line and "Usage:" not in proc.stderr


def test_inspect_context_zero_is_an_error_and_heads_print_clean(cli, pair):
    proc = cli("inspect", str(pair.target), "-c", "0")
    assert proc.returncode == 2 and "-c must be at least 1" in _error(proc)
    shown = cli("inspect", str(pair.mmproj)).stdout + cli("inspect", str(pair.target)).stdout
    assert "(None)" not in shown


def test_server_url_and_image_folder_are_named(cli, pair, tmp_path):
    proc = cli("run", "--server", "notaurl", "hi")
    assert proc.returncode == 2 and "--server takes a URL" in _error(proc)
    proc = cli("run", str(tmp_path), "hi", "--server", "http://127.0.0.1:9")
    assert proc.returncode == 2 and "image is a directory" in _error(proc)


@pytest.mark.parametrize("kind", ["truncated", "not-an-image", "missing"])
def test_bench_checks_every_prompt_image_before_any_server(cli, engine, pair, tmp_path, kind):
    """A bad image of one prompt fails the bench in one line naming the prompt and the file, with the
    check `dspark run` makes (the image decoded), before any llama-server starts (no log written)."""
    bad = tmp_path / "chart.png"
    if kind == "truncated":  # a real PNG cut short: its signature is right, it does not decode
        raw = pair.image.read_bytes()
        bad.write_bytes(raw[: len(raw) * 2 // 3])
    elif kind == "not-an-image":
        bad.write_text("no pixels here\n")
    lines = [
        json.dumps({"id": "ok-1", "category": "ocr", "prompt": "Read it", "images": [str(pair.image)]}),
        json.dumps({"id": "chart-7", "category": "ocr", "prompt": "Read it", "images": ["chart.png"]}),
    ]
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "cache"
    proc = cli(
        "bench",
        "--target",
        str(pair.target),
        "--draft",
        str(pair.draft),
        "--mmproj",
        str(pair.mmproj),
        "--prompts",
        str(prompts),
        "--reps",
        "1",
        "-n",
        "4",
        "--ctx",
        "512",
        "-t",
        "1",
        env={"DSPARK_CACHE_DIR": str(cache), "DSPARK_LLAMA_BIN": str(engine.bin_dir)},
        timeout=60,
    )
    assert proc.returncode == 2
    line = _error(proc)
    assert "mine.jsonl:2: prompt 'chart-7': " in line and str(bad) in line, line
    assert {"truncated": "not a readable image", "not-an-image": "not a readable image", "missing": "image not found"}[
        kind
    ] in line
    assert not list(cache.rglob("llama-server-*.log"))  # nothing was launched
