"""`dspark serve` under concurrent load and supervision, with the real llama-server on a synthetic
known-answer pair (every greedy answer is predicted exactly by synth.known_answer).

One `dspark serve --parallel 4` process serves the whole module, in order:
1. 4 clients x 25 requests (chat and /completion, streamed and not, 30 distinct answers) while two
   more clients keep opening streams and hanging up after two chunks: every request is answered, each
   with exactly its own prediction (a slot's tokens never reach another request), no errors, and
   llama-server's RSS stays within its idle RSS + RSS_GROWTH_MIB.
2. llama-server is SIGKILLed mid-load: serve reports the cause, restarts it on the same URL, and
   every request (retried while it restarts, as a client would) is answered exactly.
3. SIGTERM: serve stops normally (exit 0) and no llama-server is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_bench import _is_zombie, _servers_of
from test_server import _children_named, _wait_for

from dsparkcli.bench.load import stream_completion
from dsparkcli.errors import ServerError
from dsparkcli.llama import protocol
from dsparkcli.llama.client import ServerClient, stream_chat
from dsparkcli.llama.server import ServerConfig
from dsparkcli.llama.supervise import Event, Supervisor, backoff_delay
from dsparkcli.synth import known_answer as synth
from support.chat_oracle import expected_chat

N = 32
BUDGET = 3
PARALLEL = 4
CLIENTS, REQUESTS = 4, 25
CHAT_PROMPTS = 5  # "q" * 10..14: the chat template's last 5-byte chunk differs, so do the answers
RSS_GROWTH_MIB = 64  # the stated bound: peak RSS under load <= idle RSS + this
KINDS = ("chat", "chat-stream", "completion", "completion-stream")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return synth.write_pair(tmp_path_factory.mktemp("load-pair"), vocab=128, accept_rate=0.7, seed=5)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _servers_with(model: Path) -> list[int]:
    """Every live llama-server process that serves this (test-private) model file."""
    return [pid for pid in _servers_of(model) if not _is_zombie(pid)]


class Served:
    """One `dspark serve` subprocess: its info document, its stderr (supervision events) and its server."""

    def __init__(self, engine, pair, tmp: Path, *extra: str) -> None:
        self.stderr_path = tmp / "serve.err"
        self.stderr = open(self.stderr_path, "w")
        env = {**os.environ, "DSPARK_LLAMA_BIN": str(engine.bin_dir), "DSPARK_CACHE_DIR": str(tmp / "cache")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dsparkcli.cli.app",
                "serve",
                "--target",
                str(pair.target),
                "--draft",
                str(pair.draft),
                "--budget",
                str(BUDGET),
                "--parallel",
                str(PARALLEL),
                "--port",
                "0",
                "-t",
                "1",
                "--ctx",
                "512",
                "--json",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.info = json.loads("".join(iter(self.proc.stdout.readline, "}\n")) + "}")
        self.url = self.info["url"]

    def events(self) -> str:
        return self.stderr_path.read_text()

    def server_pid(self) -> int:
        return _wait_for(lambda: _children_named(self.proc.pid, "llama-server"), 30, "llama-server")[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def served(engine, pair, tmp_path_factory):
    s = Served(engine, pair, tmp_path_factory.mktemp("serve-load"), "--max-restarts", "3")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def answers(served, pair) -> dict[tuple[str, int], synth.Prediction]:
    """(kind of prompt, index) -> the predicted answer. Chat prompts go through the server's own chat
    template (/apply-template); /completion prompts are token ids, answered from their last token."""
    man = synth.load_manifest(pair.manifest)
    client = ServerClient(served.url)
    out = {
        ("chat", i): expected_chat(client, man, _messages(i), n_max=BUDGET, n_predict=N) for i in range(CHAT_PROMPTS)
    }
    out.update({("tokens", t): synth.predict(man, [1, t], n_max=BUDGET, n_predict=N) for t in range(25)})
    client.close()
    assert len({p.tokens for p in out.values()}) >= 25  # answers differ: a mixed-up reply cannot pass
    return out


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "q" * (10 + i)}]


def _job(k: int, j: int) -> tuple[str, tuple[str, int]]:
    """Client k's request j: which API, and which prompt."""
    kind = KINDS[(k + j) % len(KINDS)]
    return kind, (("chat", (k * 7 + j) % CHAT_PROMPTS) if kind.startswith("chat") else ("tokens", (k * 11 + j) % 25))


def _ask(client: ServerClient, kind: str, prompt: tuple[str, int]) -> tuple[int, ...] | str:
    """One request; returns the answer as tokens (/completion) or text (chat)."""
    if kind.startswith("chat"):
        payload = protocol.chat_payload(_messages(prompt[1]), max_tokens=N, temp=0.0, seed=0, stream=False)
        if kind == "chat":
            resp = client.chat(payload)
            assert resp["timings"]["predicted_n"] == N
            return str(resp["choices"][0]["message"]["content"])
        text, _, finish, _, _ = stream_chat(client, payload)
        assert finish == "length"
        return text
    payload = protocol.completion_payload([1, prompt[1]], n_predict=N)
    resp = client.completion(payload) if kind == "completion" else stream_completion(client, payload)[0]
    return tuple(resp["tokens"])


def _expected(answers, kind: str, prompt: tuple[str, int]) -> tuple[int, ...] | str:
    pred = answers[prompt]
    return pred.text if kind.startswith("chat") else pred.tokens


def _hang_ups(url: str, stop: threading.Event, count: list[int]) -> None:
    """Open a long stream, read two chunks, hang up; again until ``stop``."""
    body = protocol.chat_payload(_messages(0), max_tokens=400, temp=0.0, seed=0, stream=True)
    while not stop.is_set():
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                lines = resp.iter_lines()
                got = sum(1 for _, line in zip(range(4), lines) if line.startswith("data:"))
        assert got >= 2
        count[0] += 1


@pytest.mark.timing  # a wall-clock bound
def test_concurrent_load_answers_every_request_exactly(served, answers):
    pid = served.server_pid()
    idle_kib = _rss_kib(pid)
    results: dict[tuple[int, int], Any] = {}
    errors: list[str] = []
    peak = [idle_kib]
    stop = threading.Event()
    hung_up = [0]

    def client(k: int) -> None:
        c = ServerClient(served.url)
        for j in range(REQUESTS):
            kind, prompt = _job(k, j)
            try:
                results[(k, j)] = _ask(c, kind, prompt)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                errors.append(f"client {k} request {j} ({kind}): {e}")
        c.close()

    def sample_rss() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_kib(pid))
            time.sleep(0.02)

    helpers = [threading.Thread(target=sample_rss, daemon=True)]
    helpers += [threading.Thread(target=_hang_ups, args=(served.url, stop, hung_up), daemon=True) for _ in range(2)]
    for t in helpers:
        t.start()
    t0 = time.monotonic()
    clients = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(timeout=120)
    elapsed = time.monotonic() - t0
    stop.set()
    for t in helpers:
        t.join(timeout=30)
    print(
        f"{CLIENTS}x{REQUESTS} requests in {elapsed:.2f} s, {hung_up[0]} hang-ups, "
        f"RSS idle {idle_kib / 1024:.1f} MiB, peak {peak[0] / 1024:.1f} MiB"
    )
    assert errors == []
    assert len(results) == CLIENTS * REQUESTS
    for (k, j), got in results.items():
        kind, prompt = _job(k, j)
        assert got == _expected(answers, kind, prompt), (k, j, kind, prompt)
    assert hung_up[0] >= 4  # the hang-ups really overlapped the load
    assert peak[0] <= idle_kib + RSS_GROWTH_MIB * 1024
    assert served.server_pid() == pid and served.proc.poll() is None  # nothing was restarted
    assert "died" not in served.events()
    # the slots are free again: the hung-up streams were cancelled, not left running
    metrics = ServerClient(served.url)
    _wait_for(lambda: metrics.metrics().get("llamacpp:requests_processing") == 0, 20, "idle slots")
    metrics.close()


def test_a_killed_server_is_restarted_and_serves_again(served, answers):
    old = served.server_pid()
    done: list[tuple[int, int, Any]] = []
    retries = [0]
    per_client = 10

    def client(k: int) -> None:
        c = ServerClient(served.url, timeout=30)
        for j in range(per_client):
            kind, prompt = _job(k, j)
            deadline = time.monotonic() + 60
            while True:  # a client retries while the server restarts
                try:
                    done.append((k, j, _ask(c, kind, prompt)))
                    break
                except ServerError:
                    retries[0] += 1
                    assert time.monotonic() < deadline, "no answer within 60 s of the kill"
                    time.sleep(0.05)
        c.close()

    clients = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in clients:
        t.start()
    _wait_for(lambda: len(done) >= 6, 60, "requests before the kill")
    os.kill(old, signal.SIGKILL)
    for t in clients:
        t.join(timeout=120)
    assert len(done) == CLIENTS * per_client
    for k, j, got in done:
        kind, prompt = _job(k, j)
        assert got == _expected(answers, kind, prompt), (k, j, kind)
    assert retries[0] >= 1  # the kill hit requests in flight (or arriving while it restarted)
    new = served.server_pid()
    assert new != old
    assert not Path(f"/proc/{old}").exists() or _is_zombie(old)
    events = served.events()
    assert "llama-server failed during serving (signal 9, SIGKILL): killed by a signal" in events
    assert "restarting llama-server in 0.5 s (attempt 1 of 3)" in events
    assert f"llama-server restarted (pid {new}) and healthy on {served.url}" in events
    assert "-died-1.log" in events  # the dead server's log is kept


def test_sigterm_stops_serve_and_every_server(served, pair):
    pid = served.server_pid()
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=30) == 0
    _wait_for(lambda: not _servers_with(pair.target), 10, "no llama-server left")
    assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


# ------------------------------------------------------------------ supervision limits


@pytest.mark.timing  # a wall-clock bound
def test_restarts_that_keep_failing_end_serve_in_one_line(engine, tmp_path):
    """The target disappears, then llama-server dies: each restart fails (file missing), and after
    --max-restarts 2 serve gives up with exit 4 and the cause; nothing is left running."""
    pair = synth.write_pair(tmp_path / "p", vocab=128, seed=1)
    s = Served(engine, pair, tmp_path, "--max-restarts", "2")
    try:
        pid = s.server_pid()
        moved = pair.target.rename(pair.target.with_suffix(".moved"))
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        assert s.proc.wait(timeout=30) == 4
        took = time.monotonic() - t0
    finally:
        s.close()
    events = s.events()
    lines = events.strip().splitlines()
    assert lines[-1] == (
        f"dspark: error: llama-server failed 3 times in a row; gave up after 2 restarts: "
        f"target model not found: {pair.target}"
    )
    assert "restarting llama-server in 0.5 s (attempt 1 of 2)" in events
    assert "restarting llama-server in 1 s (attempt 2 of 2)" in events
    assert events.count("target model not found") == 3  # two failed restarts, then the verdict
    assert "Traceback" not in events
    assert 1.5 <= took < 20  # the backoff was waited, and bounded
    assert not _servers_with(moved) and not _servers_with(pair.target)


def test_a_server_that_stayed_up_clears_the_restart_count(engine, pair):
    """max_restarts=1: with stable_s=0 every death is a fresh one (restarted each time); with a long
    stable_s the second death in a row is one too many."""
    events: list[Event] = []
    cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=BUDGET, threads=1, ctx=512)
    with Supervisor(engine, cfg, on_event=events.append, max_restarts=1, stable_s=0.0, backoff_base=0.05) as sup:
        for _ in range(2):
            old = sup.server.pid
            os.kill(old, signal.SIGKILL)
            sup.server.process.wait()
            sup.check()
            assert sup.server.pid != old and sup.server.client.health() == 200
        assert sup.restarts == 2
        assert [e.kind for e in events] == ["died", "restarting", "ready"] * 2
        assert sup.server.port == sup.config.port  # the same URL every time
    with Supervisor(engine, cfg, on_event=events.append, max_restarts=1, stable_s=3600.0, backoff_base=0.05) as sup:
        os.kill(sup.server.pid, signal.SIGKILL)
        sup.server.process.wait()
        sup.check()
        os.kill(sup.server.pid, signal.SIGKILL)
        sup.server.process.wait()
        with pytest.raises(
            ServerError,
            match=r"^llama-server failed 2 times in a row; gave up after 1 restarts: "
            r"llama-server failed during serving \(signal 9, SIGKILL\)",
        ):
            sup.check()


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_first_start_failure_is_not_retried(engine, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    events: list[Event] = []
    with pytest.raises(ServerError) as e:
        Supervisor(engine, ServerConfig(model=bad, threads=1), on_event=events.append).start()
    assert e.value.kind == "bad-gguf" and events == []
