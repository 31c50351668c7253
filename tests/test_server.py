"""LlamaServer lifecycle with the real llama-server: start, answer, stop, typed load failures, no orphans."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsparkcli.errors import ServerError, UsageError
from dsparkcli.llama.protocol import parse_metrics
from dsparkcli.llama.server import LlamaServer, ServerConfig, classify_log, free_port
from dsparkcli.synth import known_answer as synth

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=128, accept_rate=1.0, seed=3)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose, but only if nobody reaps it; check /proc state
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children_named(parent: int, name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm.startswith(name[:15]) and not _probe(entry):
            found.append(int(entry.name))
    return found


def _probe(proc: Path) -> bool:
    """dspark asking the binary what it can do (`--help`, `--version`; run and serve ask for draft-dspark
    before they start the server), or a child already gone (a zombie has no command line): not the server."""
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return argv == [b""] or bool({b"--help", b"--version", b"--list-devices"} & set(argv))


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_server_starts_answers_and_stops(engine, pair, tmp_path):
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=7, threads=2, ctx=1024)
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        pid = srv.pid
        assert srv.url.startswith("http://127.0.0.1:")
        assert _alive(pid)
        resp = srv.client.completion({"prompt": [5, 9, 17], "n_predict": 16, "temperature": 0, "return_tokens": True})
        man = synth.load_manifest(pair.manifest)
        expected = synth.predict(man, [5, 9, 17], n_max=7, n_predict=16)
        assert resp["tokens"] == list(expected.tokens)
        assert resp["timings"]["draft_n"] == expected.draft_n
        assert resp["timings"]["draft_n_accepted"] == expected.draft_n_accepted
        metrics = srv.client.metrics()
        assert metrics["llamacpp:spec_decode_num_drafts_total"] == expected.steps
        assert "--spec-type" in srv.argv and "draft-dspark" in srv.argv
        assert (
            srv.log_path.is_file() and "adding speculative implementation 'draft-dspark'" in srv.log_path.read_text()
        )
    assert not _alive(pid)
    assert srv.process.returncode == 0  # SIGTERM when idle: clean exit


def test_missing_model_is_a_usage_error(engine, tmp_path):
    with pytest.raises(UsageError, match="target model not found"):
        LlamaServer(engine, ServerConfig(model=tmp_path / "nope.gguf")).start()


def test_bad_gguf_is_typed_with_log_tail(engine, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + os.urandom(4096))
    with pytest.raises(ServerError) as info:
        LlamaServer(engine, ServerConfig(model=bad, threads=2), log_dir=tmp_path).start()
    assert info.value.kind == "bad-gguf"
    assert "invalid magic" in info.value.log_tail
    assert "\n" not in str(info.value)


def test_wrong_arch_draft_is_typed_not_a_hang(engine, pair, tmp_path):
    # the llama target used as a DSpark draft makes llama.cpp assert (target_layer_ids_n > 0)
    cfg = ServerConfig(model=pair.target, draft=pair.target, n_max=3, threads=2, ctx=512)
    with pytest.raises(ServerError) as info:
        LlamaServer(engine, cfg, log_dir=tmp_path, startup_timeout=60).start()
    assert info.value.kind in ("unsupported-arch", "crash")
    assert "GGML_ASSERT" in info.value.log_tail or "target_layer" in info.value.log_tail


def test_launches_on_one_port_within_one_second_keep_one_log_each(engine, pair, tmp_path, monkeypatch):
    # a supervisor's restart, or a bench's next server, on the port just freed: the clock is held still
    # so every launch falls within the same second (a FileExistsError before the launch counter)
    from dsparkcli.llama import server as server_mod

    monkeypatch.setattr(server_mod.time, "strftime", lambda fmt, *a: "20260101-000000")
    port = free_port()
    logs = []
    for _ in range(3):
        with LlamaServer(
            engine, ServerConfig(model=pair.target, port=port, threads=1, ctx=256), log_dir=tmp_path
        ) as srv:
            logs.append(srv.log_path)
    assert len(set(logs)) == 3 and all(p.stat().st_size > 0 for p in logs)


def test_port_in_use_is_typed(engine, pair, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError) as info:
            LlamaServer(
                engine, ServerConfig(model=pair.target, port=port, threads=2, ctx=512), log_dir=tmp_path
            ).start()
    assert info.value.kind == "port"


@pytest.mark.timing  # a wall-clock bound
def test_stop_escalates_to_sigkill_when_sigterm_hangs(engine, pair, tmp_path):
    """llama-server hangs on SIGTERM during a non-streaming request: stop() must still end it."""
    import threading

    cfg = ServerConfig(model=pair.target, threads=1, ctx=32768)
    srv = LlamaServer(engine, cfg, log_dir=tmp_path, stop_grace=1.0).start()
    pid = srv.pid
    errors: list[BaseException] = []

    def long_request():
        try:
            srv.client.completion({"prompt": [1], "n_predict": 30000, "temperature": 0, "ignore_eos": True})
        except BaseException as e:  # noqa: BLE001 - the connection dies with the server
            errors.append(e)

    t = threading.Thread(target=long_request, daemon=True)
    t.start()
    _wait_for(
        lambda: (
            "slot update_slots" in srv.log_path.read_text()
            or "prompt processing" in srv.log_path.read_text()
            or "launch_slot" in srv.log_path.read_text()
        ),
        10,
        "request to start",
    )
    time.sleep(0.2)
    started = time.monotonic()
    rc = srv.stop()
    assert time.monotonic() - started < 10
    assert not _alive(pid)
    assert rc is not None
    t.join(5)


def _run_dspark(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dsparkcli.cli.app", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_mid_stream_leaves_no_server(engine, pair, sig):
    proc = _run_dspark(
        [
            "run",
            "--target",
            str(pair.target),
            "--draft",
            str(pair.draft),
            "--budget",
            "7",
            "--max-tokens",
            "4000",
            "--ctx",
            "4096",
            "-t",
            "1",
            "count forever",
        ]
    )
    try:
        server_pid = _wait_for(lambda: _children_named(proc.pid, "llama-server"), 30, "llama-server child")[0]
        assert proc.stdout is not None
        first = proc.stdout.read(8)  # streaming has begun
        assert len(first) == 8
        proc.send_signal(sig)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, proc.stderr.read()
    stderr = proc.stderr.read()
    assert stderr.strip().splitlines()[-1] == "dspark: error: interrupted"
    assert "Traceback" not in stderr
    _wait_for(lambda: not _alive(server_pid), 10, "llama-server to be gone")


def test_sigint_during_model_load_leaves_no_server(engine, pair, tmp_path):
    # a FIFO as a --lora adapter blocks llama-server inside its start-up, deterministically
    fifo = tmp_path / "lora.fifo"
    os.mkfifo(fifo)
    proc = _run_dspark(["run", "--target", str(pair.target), "-t", "1", "hello", "--", "--lora", str(fifo)])
    try:
        server_pid = _wait_for(lambda: _children_named(proc.pid, "llama-server"), 30, "llama-server child")[0]
        time.sleep(0.5)
        assert _alive(server_pid)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130
    _wait_for(lambda: not _alive(server_pid), 10, "llama-server to be gone")


def test_sigkill_of_dspark_still_kills_the_server(engine, pair, tmp_path):
    fifo = tmp_path / "lora.fifo"
    os.mkfifo(fifo)
    proc = _run_dspark(["run", "--target", str(pair.target), "-t", "1", "hello", "--", "--lora", str(fifo)])
    server_pid = _wait_for(lambda: _children_named(proc.pid, "llama-server"), 30, "llama-server child")[0]
    proc.kill()  # no Python cleanup at all: PR_SET_PDEATHSIG must do it
    proc.wait(timeout=10)
    _wait_for(lambda: not _alive(server_pid), 10, "llama-server to be gone")


def test_classify_log_kinds():
    assert (
        classify_log("gguf_init_from_file: failed to open GGUF file 'x' (No such file or directory)")[0]
        == "missing-file"
    )
    assert classify_log("gguf_init_from_file_impl: invalid magic characters: 'NOPE'")[0] == "bad-gguf"
    assert (
        classify_log(
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000 MiB: cudaMalloc failed: out of memory"
        )[0]
        == "out-of-memory"
    )
    assert (
        classify_log("llama_model_load: error loading model: unknown model architecture: 'foo'")[0]
        == "unsupported-arch"
    )
    assert classify_log("start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080")[0] == "port"
    assert classify_log("ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed")[0] == "crash"


def test_parse_metrics():
    text = """# HELP llamacpp:spec_decode_num_drafts_total drafts
llamacpp:spec_decode_num_drafts_total 14
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 14
"""
    m = parse_metrics(text)
    assert m["llamacpp:spec_decode_num_drafts_total"] == 14.0
    assert m['llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"}'] == 14.0


def test_argv_from_config():
    cfg = ServerConfig(
        model=Path("t.gguf"),
        draft=Path("d.gguf"),
        mmproj=Path("m.gguf"),
        n_max=5,
        n_min=1,
        p_min=0.5,
        ngl=99,
        ngld=99,
        flash_attn="on",
        ctx=8192,
        extra_args=("--jinja",),
    )
    argv = cfg.argv(Path("/bin/llama-server"), 1234)
    joined = " ".join(argv)
    assert "--host 127.0.0.1 --port 1234 -m t.gguf" in joined
    assert "--mmproj m.gguf -md d.gguf --spec-type draft-dspark" in joined
    for flag in (
        "--spec-draft-n-max 5",
        "--spec-draft-n-min 1",
        "--spec-draft-p-min 0.5",
        "-ngl 99",
        "-ngld 99",
        "-fa on",
        "-c 8192",
        "--metrics",
    ):
        assert flag in joined
    assert argv[-1] == "--jinja"


def test_api_key_is_not_in_argv_or_log(engine, pair, tmp_path):
    cfg = ServerConfig(model=pair.target, threads=2, ctx=512, api_key="sk-secret-123")
    with LlamaServer(engine, cfg, log_dir=tmp_path) as srv:
        assert "sk-secret-123" not in " ".join(srv.argv)
        assert srv.client.completion({"prompt": [1], "n_predict": 2})["timings"]["predicted_n"] == 2
        from dsparkcli.llama.client import ServerClient

        anon = ServerClient(srv.url)
        with pytest.raises(ServerError, match="HTTP 401"):
            anon.completion({"prompt": [1], "n_predict": 2})
        anon.close()
    assert "sk-secret-123" not in srv.log_path.read_text()


def test_default_log_folder_keeps_the_newest_logs(engine, pair, tmp_path, monkeypatch):
    from dsparkcli.llama.server import KEEP_LOGS

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(KEEP_LOGS + 10):
        old = logs / f"llama-server-{i}.log"
        old.write_text("old")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    with LlamaServer(engine, ServerConfig(model=pair.target, threads=1, ctx=512)) as srv:
        assert srv.log_path.parent == logs
    remaining = sorted(p.name for p in logs.glob("llama-server-*.log"))
    assert len(remaining) == KEEP_LOGS + 1  # the newest KEEP_LOGS old ones, plus this run's
    assert "llama-server-0.log" not in remaining and f"llama-server-{KEEP_LOGS + 9}.log" in remaining
    assert srv.log_path.name in remaining


def test_an_engine_abort_is_named_by_its_own_line(tmp_path: Path) -> None:
    """SIGABRT from GGML_ABORT (the H200's 16-slot draft-dspark crash, its log as recorded) reports the
    abort's line; a SIGKILL with nothing telling in the log stays "killed by a signal"."""
    root = Path(__file__).resolve().parent.parent
    srv = LlamaServer.__new__(LlamaServer)
    srv.log_path = root / "study/results/h200/load2/abort16.log"
    e = srv._died(-6, during="generation (real16@1 x16)")
    assert e.message == (
        "llama-server failed during generation (real16@1 x16) (signal 6, SIGABRT): "
        "/tmp/ds/src/llama_cpp_python-0.3.36/vendor/llama.cpp/common/common.cpp:2158: get_sub_batch: "
        "failed to add token 1100540700 at index 9 (error -2, n = 24)"
    )
    assert e.kind == "crash"
    quiet = tmp_path / "quiet.log"
    quiet.write_text("main: server is listening on http://127.0.0.1:8080\nslot launch_slot_: id 0 | task 0\n")
    srv.log_path = quiet
    assert srv._died(-9, during="serving").message.endswith("(signal 9, SIGKILL): killed by a signal")


def test_scripts_split_their_own_arguments_from_llama_servers():
    from dsparkcli.llama.server import split_server_args

    assert split_server_args(["--out", "d", "--", "-ngl", "99", "--", "x"]) == (
        ["--out", "d"],
        ["-ngl", "99", "--", "x"],
    )
    assert split_server_args(["--out", "d"]) == (["--out", "d"], [])
