"""`dspark run` / `dspark serve` with the real llama-server on the synthetic vision pair.

Every number is predicted independently (synth.predict_from_last on the server's own templated
prompt) and compared exactly with what dspark prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsparkcli
from dsparkcli import runner
from dsparkcli.llama import protocol
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth
from support.chat_oracle import expected_chat

PROMPT = "What is in this image?"
N = 40
BUDGET = 5


@pytest.fixture(scope="module")
def vpair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("vpair"), vocab=128, accept_rate=0.7, vision=True, seed=11)


@pytest.fixture(scope="module")
def expected(engine, vpair):
    """The prediction for PROMPT + image at BUDGET, read from a server's own chat template."""
    man = synth.load_manifest(vpair.manifest)
    img = runner.load_image(vpair.image)
    cfg = ServerConfig(model=vpair.target, mmproj=vpair.mmproj, threads=2, ctx=1024)
    with LlamaServer(engine, cfg) as srv:
        pred = expected_chat(
            srv.client, man, protocol.build_messages(PROMPT, [img.data_url]), n_max=BUDGET, n_predict=N
        )
    assert pred.draft_n > pred.draft_n_accepted > 0  # accept rate 0.7: a non-trivial case
    return pred


def _args(vpair, *extra: str) -> list[str]:
    return [
        "run",
        str(vpair.image),
        PROMPT,
        "--target",
        str(vpair.target),
        "--draft",
        str(vpair.draft),
        "--mmproj",
        str(vpair.mmproj),
        "--max-tokens",
        str(N),
        "-t",
        "2",
        "--ctx",
        "1024",
        *extra,
    ]


def test_run_streams_the_predicted_text_and_stats(cli, vpair, expected):
    proc = cli(*_args(vpair, "--budget", str(BUDGET)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected.text + "\n"
    stats = proc.stderr.strip().splitlines()[-1]
    rate = 100 * expected.draft_n_accepted / expected.draft_n
    assert f"{N} tokens" in stats
    assert f"budget {BUDGET}" in stats
    assert f"drafted {expected.draft_n}" in stats
    assert f"accepted {expected.draft_n_accepted} ({rate:.1f} %)" in stats
    assert f"mean acceptance length {expected.mean_len:.2f}" in stats
    assert "tok/s" in stats


def test_run_json_record_is_complete(cli, vpair, expected):
    proc = cli(*_args(vpair, "--budget", str(BUDGET), "--json"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["text"] == expected.text
    assert rec["n_tokens"] == N
    assert rec["drafted"] == expected.draft_n
    assert rec["accepted"] == expected.draft_n_accepted
    assert rec["steps"] == expected.steps
    assert rec["mean_acceptance_length"] == pytest.approx(expected.mean_len)
    assert rec["acceptance_rate"] == pytest.approx(expected.draft_n_accepted / expected.draft_n)
    assert rec["budget"] == BUDGET
    assert rec["decode_tok_s"] > 0 and rec["prompt_tok_s"] > 0 and rec["prompt_tokens"] > 4
    assert rec["finish_reason"] == "length"
    assert set(rec["files"]) == {"target", "draft", "mmproj"}
    assert "--spec-draft-n-max" in rec["server_argv"]


def test_no_draft_gives_the_same_text(cli, vpair, expected):
    proc = cli(*_args(vpair, "--no-draft", "--json"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["text"] == expected.text
    assert rec["drafted"] is None and rec["budget"] is None
    assert "-md" not in rec["server_argv"]


def test_python_api_returns_a_frozen_result(engine, vpair, expected):
    streamed: list[str] = []
    result = dsparkcli.run(
        PROMPT,
        [vpair.image],
        target=vpair.target,
        draft=vpair.draft,
        mmproj=vpair.mmproj,
        budget=BUDGET,
        max_tokens=N,
        threads=2,
        ctx=1024,
        on_text=streamed.append,
    )
    assert "".join(streamed) == result.text == expected.text
    assert result.acceptance.drafted == expected.draft_n
    assert result.acceptance.accepted == expected.draft_n_accepted
    assert result.acceptance.mean_len == pytest.approx(expected.mean_len)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.text = "x"  # type: ignore[misc]


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    assert proc.returncode != 0
    if code is not None:
        assert proc.returncode == code, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("dspark: error: "), proc.stderr
    return lines[-1]


def test_bad_image_is_one_line(cli, vpair, tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(200))
    msg = _one_line_error(cli("run", str(bad), "hi", "--target", str(vpair.target), "--mmproj", str(vpair.mmproj)), 2)
    assert "not a readable image" in msg and str(bad) in msg


def test_missing_image_and_missing_model(cli, vpair, tmp_path):
    assert "image not found" in _one_line_error(
        cli("run", str(tmp_path / "x.png"), "hi", "--target", str(vpair.target)), 2
    )
    assert "target model not found" in _one_line_error(cli("run", "hi", "--target", str(tmp_path / "t.gguf")), 2)
    assert "draft model not found" in _one_line_error(
        cli("run", "hi", "--target", str(vpair.target), "--draft", str(tmp_path / "d.gguf")), 2
    )


def test_image_without_mmproj_is_refused(cli, vpair):
    msg = _one_line_error(cli("run", str(vpair.image), "hi", "--target", str(vpair.target)), 2)
    assert "--mmproj" in msg


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_wrong_pair_is_refused_before_launch(cli, vpair, tmp_path):
    other = synth.write_pair(tmp_path / "other", vocab=96, seed=2)
    proc = cli("run", "hi", "--target", str(vpair.target), "--draft", str(other.draft), "-t", "2")
    msg = _one_line_error(proc, 1)
    assert "does not fit" in msg
    assert "GGML_ASSERT" not in proc.stderr


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_wrong_mmproj_is_named_as_the_mmproj(cli, vpair, tmp_path):
    """The draft fits; the projector does not: the one line names the mmproj file and the widths, not the draft."""
    other = synth.write_pair(tmp_path / "other", vocab=200, vision=True, seed=2)  # n_embd 256, not 128
    proc = cli(
        "run",
        str(vpair.image),
        "hi",
        "--target",
        str(vpair.target),
        "--draft",
        str(vpair.draft),
        "--mmproj",
        str(other.mmproj),
        "-t",
        "2",
    )
    msg = _one_line_error(proc, 1)
    assert msg.startswith(
        f"dspark: error: mmproj {other.mmproj} does not fit target {vpair.target}: mmproj width: "
        "the projector feeds 256-wide embeddings (mm.2.weight ne[1] (mlp)), the target's are 128"
    ), msg
    assert str(vpair.draft) not in msg and "loading" not in proc.stderr


def test_server_crash_during_generation_is_one_line(engine, vpair):
    """Kill llama-server while dspark streams: a typed one-line error, not a hang or a traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsparkcli.cli.app",
            "run",
            "--target",
            str(vpair.target),
            "--draft",
            str(vpair.draft),
            "--max-tokens",
            "4000",
            "--ctx",
            "4096",
            "-t",
            "1",
            "go on",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    from test_server import _children_named, _wait_for

    try:
        server_pid = _wait_for(lambda: _children_named(proc.pid, "llama-server"), 30, "llama-server")[0]
        assert proc.stdout.read(8)
        os.kill(server_pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 4, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("dspark: error: ") and "llama-server" in last
    assert "Traceback" not in stderr


def test_serve_then_run_against_it(engine, vpair, expected, tmp_path):
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsparkcli.cli.app",
            "serve",
            "--target",
            str(vpair.target),
            "--draft",
            str(vpair.draft),
            "--mmproj",
            str(vpair.mmproj),
            "--budget",
            str(BUDGET),
            "--port",
            "0",
            "-t",
            "2",
            "--ctx",
            "1024",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        info = json.loads("".join(iter(serve.stdout.readline, "}\n")) + "}")
        assert info["url"].startswith("http://127.0.0.1:") and info["budget"] == BUDGET
        for _ in range(2):  # the model stays loaded between questions
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dsparkcli.cli.app",
                    "run",
                    str(vpair.image),
                    PROMPT,
                    "--server",
                    info["url"],
                    "--max-tokens",
                    str(N),
                    "--json",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            rec = json.loads(proc.stdout)
            assert rec["text"] == expected.text
            assert rec["drafted"] == expected.draft_n and rec["accepted"] == expected.draft_n_accepted
            assert rec["mean_acceptance_length"] == pytest.approx(expected.mean_len)
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "dsparkcli.cli.app",
                "run",
                str(vpair.image),
                PROMPT,
                "--server",
                info["url"],
                "--max-tokens",
                str(N),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and shown.stdout.strip() == expected.text, shown.stderr
        stats = shown.stderr.strip().splitlines()[-1]  # run asks the server its budget first and names it
        assert (
            f"| budget {info['budget']} | drafted {expected.draft_n} | accepted {expected.draft_n_accepted} " in stats
        )
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=20) == 0  # the normal end of serve
    finally:
        if serve.poll() is None:
            serve.kill()
    pid = info["pid"]
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


def test_serve_refuses_exposed_host_without_key(cli, vpair):
    msg = _one_line_error(cli("serve", "--target", str(vpair.target), "--host", "0.0.0.0"), 2)
    assert "--api-key" in msg


@pytest.mark.engine  # asks the built llama-server (its --help/--version) through the CLI, without the fixture
def test_serve_port_in_use_is_one_line(cli, vpair):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        msg = _one_line_error(cli("serve", "--target", str(vpair.target), "--port", str(port), "-t", "2"), 4)
    assert f"port {port} on 127.0.0.1 is in use" in msg  # checked before the model loads


@pytest.mark.parametrize(
    "given,named",
    [
        (("--budget", "auto"), "--budget auto"),  # a number is the request's own (tests/test_adaptive.py)
        (("--target", "t.gguf", "--draft", "d.gguf"), "--target, --draft"),
        (("--model", "smollm2-135m"), "--model"),
        (("--mmproj", "mm.gguf", "--ctx", "512"), "--mmproj, --ctx"),
        (("--p-min", "auto", "--", "-fa", "on"), "--p-min auto, arguments after --"),
    ],
)
def test_run_server_refuses_what_only_a_start_can_use(cli, given, named):
    # port 9 (discard) has no server: the refusal comes before any connection
    msg = _one_line_error(cli("run", "hi", "--server", "http://127.0.0.1:9", *given), 2)
    assert msg.startswith(
        f"dspark: error: {named}: set when a server starts, so they cannot apply to --server http://127.0.0.1:9"
    ), msg


@pytest.mark.timing  # compares the fastest runs of two clients
def test_dspark_adds_no_measurable_overhead(engine, vpair):
    """Same server, same request, interleaved: dspark's streaming path vs a bare HTTP client.

    The issue's bar is >= 0.99x decode tok/s and TTFT within 50 ms on medians of 10; the recorded runs
    (study/run_overhead.py -> BENCHMARKS.md) report those medians. On a shared 2-core machine other
    processes slow single requests of a tiny model by up to 20x, which swamps medians; interference
    only ever slows a run, so this guard compares the fastest run of each side (>= 0.95x) and the
    quickest first token (within 50 ms).
    """
    from support.scripts import script

    overhead = script("overhead")

    # -t 1 leaves a core for the client: with llama.cpp's threads on every core of a 2-core machine, any
    # client's CPU time slows generation (measured: 0.95x at -t 2, 1.01x at -t 1; study/results/cpu/)
    cfg = ServerConfig(model=vpair.target, draft=vpair.draft, n_max=BUDGET, threads=1, ctx=4096)
    with LlamaServer(engine, cfg) as srv:
        result = overhead.measure(srv.client, "count", reps=10, n_predict=1024)
    assert len(result.bare_decode_tok_s) == len(result.dspark_decode_tok_s) == 10
    assert result.decode_ratio_best >= 0.95, result.to_record()
    assert result.ttft_delta_best_s <= 0.050, result.to_record()


@pytest.fixture
def hub_env(tmp_path, vpair, engine, user_models):
    """The synthetic vision pair served by FakeHub, a registry entry for it, an empty HF cache."""
    from support.hubserver import FakeHub

    with FakeHub() as hub:
        for path in (vpair.target, vpair.draft, vpair.mmproj):
            hub.add_file("synth/pair", path.name, path.read_bytes())
        cfg = user_models(f"""
[pairs.synth]
budget = {BUDGET}
default_draft = "q"
[pairs.synth.target]
repo = "synth/pair"
filename = "{vpair.target.name}"
[pairs.synth.mmproj]
repo = "synth/pair"
filename = "{vpair.mmproj.name}"
[pairs.synth.drafts.q]
repo = "synth/pair"
glob = "draft-*.gguf"
""")
        yield {
            **hub.client_env(tmp_path / "hf"),
            "DSPARK_CONFIG_DIR": str(cfg),
            "DSPARK_LLAMA_BIN": str(engine.server),
        }


def test_run_with_hf_references(cli, vpair, expected, hub_env):
    proc = cli(
        "run",
        str(vpair.image),
        PROMPT,
        "--target",
        f"hf://synth/pair/{vpair.target.name}",
        "--draft",
        f"hf://synth/pair/{vpair.draft.name}",
        "--mmproj",
        f"hf://synth/pair/{vpair.mmproj.name}",
        "--budget",
        str(BUDGET),
        "--max-tokens",
        str(N),
        "-t",
        "2",
        "--ctx",
        "1024",
        "--json",
        env=hub_env,
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["text"] == expected.text
    assert (rec["drafted"], rec["accepted"]) == (expected.draft_n, expected.draft_n_accepted)
    assert all(Path(p).is_relative_to(hub_env["HF_HOME"]) for p in rec["files"].values())


def test_run_with_a_registry_model(cli, vpair, expected, hub_env):
    """--model NAME: files resolved (the draft through a glob), fetched, verified, paired, then run."""
    proc = cli(
        "run",
        str(vpair.image),
        PROMPT,
        "--model",
        "synth",
        "--max-tokens",
        str(N),
        "-t",
        "2",
        "--ctx",
        "1024",
        "--json",
        env=hub_env,
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["budget"] == BUDGET  # the registry's default budget
    assert rec["text"] == expected.text
    assert (rec["drafted"], rec["accepted"]) == (expected.draft_n, expected.draft_n_accepted)
    assert Path(rec["files"]["draft"]).name == vpair.draft.name
    # offline afterwards: the verified cache serves the same run without the hub
    proc = cli(
        "run",
        str(vpair.image),
        PROMPT,
        "--model",
        "synth",
        "--max-tokens",
        str(N),
        "-t",
        "2",
        "--ctx",
        "1024",
        "--json",
        env={**hub_env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == expected.text


def test_unknown_model_name_suggests(cli, hub_env):
    msg = _one_line_error(cli("run", "hi", "--model", "synht", env=hub_env), 2)
    assert "synth" in msg


def test_no_draft_does_not_download_the_draft(cli, vpair, expected, hub_env):
    proc = cli(
        "run",
        str(vpair.image),
        PROMPT,
        "--model",
        "synth",
        "--no-draft",
        "--max-tokens",
        str(N),
        "-t",
        "2",
        "--ctx",
        "1024",
        "--json",
        env=hub_env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == expected.text
    cached = {p.name for p in Path(hub_env["HF_HOME"]).rglob("*.gguf")}
    assert cached == {vpair.target.name, vpair.mmproj.name}
