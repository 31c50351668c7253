"""`dspark serve` as a user runs it, with the real llama-server on a synthetic pair: the API key never in
argv, one log per launch, Ctrl-C is a normal stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_server import _alive

from dsparkcli.synth import known_answer as synth

SECRET = "sk-dspark-test-7f3a9"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("pair"), vocab=64, seed=3)


def _serve(pair, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", "dsparkcli.cli.app", "serve", "--target", str(pair.target),
                             "--draft", str(pair.draft), "--port", "0", "-t", "1", "--ctx", "256", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    text = "".join(iter(proc.stdout.readline, "}\n"))
    if not text.strip():
        proc.wait(timeout=30)
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(text + "}")


def _stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, proc.stderr.read()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.parametrize("how", ["env", "file"])
def test_api_key_from_env_or_file_is_in_no_command_line(engine, pair, tmp_path, how):
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    extra, env = (("--api-key-file", str(key_file)), None) if how == "file" else ((), {"DSPARK_API_KEY": SECRET})
    proc, info = _serve(pair, *extra, env=env)
    try:
        assert SECRET not in _cmdline(proc.pid) and SECRET not in _cmdline(info["pid"])
        assert SECRET not in Path(info["log"]).read_text(errors="replace")
        assert httpx.get(info["url"] + "/v1/models").status_code == 401  # the key is enforced
        assert httpx.get(info["url"] + "/v1/models", headers={"Authorization": f"Bearer {SECRET}"}).status_code == 200
    finally:
        rc, stderr = _stop(proc)
    assert "warning" not in stderr and SECRET not in stderr


def test_api_key_on_the_command_line_warns(cli, tmp_path):
    # refused later for the absent target; the warning comes first, and never shows the key
    proc = cli("serve", "--target", str(tmp_path / "absent.gguf"), "--api-key", SECRET)
    assert "dspark: warning: --api-key on the command line is visible" in proc.stderr
    assert "DSPARK_API_KEY" in proc.stderr and "--api-key-file" in proc.stderr and SECRET not in proc.stderr


def test_api_key_file_problems_are_one_line(cli, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args, words in ((("--api-key-file", str(tmp_path / "none")), "cannot read --api-key-file"),
                        (("--api-key-file", str(empty)), "is empty"),
                        (("--api-key-file", str(empty), "--api-key", "k"), "not both")):
        proc = cli("serve", "--target", "t.gguf", *args)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("dspark: error: ")
        assert words in proc.stderr, proc.stderr


def test_a_second_serve_on_a_busy_port_keeps_the_first_log(engine, pair):
    first, info = _serve(pair)
    try:
        log = Path(info["log"])
        before = log.read_bytes()
        assert b"server is listening" in before or b"HTTP server" in before or len(before) > 1000
        port = info["url"].rsplit(":", 1)[1]
        second = subprocess.run([sys.executable, "-m", "dsparkcli.cli.app", "serve", "--target", str(pair.target),
                                 "--port", port, "-t", "1", "--ctx", "256"], capture_output=True, text=True, timeout=120)
        assert second.returncode == 4 and "port" in second.stderr.strip().splitlines()[-1], second.stderr
        assert httpx.get(info["url"] + "/health").status_code == 200  # the first one still serves
        after = log.read_bytes()
        assert after.startswith(before) and b"\0" not in after  # neither truncated nor overwritten
        assert str(log) not in second.stderr  # the failed launch pointed at its own log
    finally:
        _stop(first)


STOP_BOUND_S = 3.0  # llama-server's SIGKILL comes after STOP_GRACE_S (1 s); it took 5.1 s (the old 5 s grace)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_serve_normally_and_fast_with_streams_in_flight(engine, pair, sig):
    """Ctrl-C / SIGTERM is how serve ends: "stopped", exit 0, within ~1 s although two streams fill both
    slots and a third waits (llama-server never exits on SIGTERM while a stream is open), no orphan."""
    import threading

    proc, info = _serve(pair, "--parallel", "2", "--ctx", "1024")
    chunks: list[int] = []

    def stream() -> None:
        body = {"prompt": [1, 2], "n_predict": 1000, "stream": True, "ignore_eos": True, "temperature": 0}
        try:
            with httpx.stream("POST", info["url"] + "/completion", json=body, timeout=60) as resp:
                for line in resp.iter_lines():
                    chunks.append(len(line))
        except httpx.HTTPError:
            pass  # the server goes away under it

    clients = [threading.Thread(target=stream, daemon=True) for _ in range(3)]
    try:
        for t in clients:
            t.start()
        deadline = time.monotonic() + 30
        while len(chunks) < 40 and time.monotonic() < deadline:  # both slots are streaming
            time.sleep(0.02)
        assert len(chunks) >= 40, "no stream started"
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert rc == 0, stderr
    assert stderr.strip().splitlines()[-1] == "dspark serve: stopped"
    assert "error" not in stderr and "Traceback" not in stderr
    assert took < STOP_BOUND_S, f"serve took {took:.2f} s to stop"
    assert not _alive(info["pid"])  # llama-server is gone (reaped by serve)
