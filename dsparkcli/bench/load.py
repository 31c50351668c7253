"""The client side of `dspark bench --concurrency N`: N clients in flight against one llama-server -np N.

A pass starts N threads together (a barrier); client k sends its own list of requests one after the
other, so N requests are in flight until the lists run out. Every request is a streamed /completion
(greedy, ``return_tokens``), so its first token's delay is seen as a user sees it; the streamed
pieces are put back together into the shape of a non-streamed response, for the same records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from dsparkcli.llama.client import ServerClient

Job = TypeVar("Job")


@dataclass(frozen=True)
class Answer(Generic[Job]):
    client: int
    job: Job
    response: dict[str, Any]  # content, tokens, timings, stop_type (+ tokens_evaluated, truncated when sent)
    ttft_ms: float | None  # None when nothing was generated
    latency_ms: float  # request sent -> last byte
    start_s: float  # perf_counter() when it was sent
    end_s: float


def stream_completion(client: ServerClient, payload: dict[str, Any]) -> tuple[dict[str, Any], float | None, float]:
    """One streamed /completion: (response as a non-streamed one would be, ttft ms, latency ms)."""
    content: list[str] = []
    tokens: list[int] = []
    final: dict[str, Any] = {}
    ttft: float | None = None
    started = time.perf_counter()
    for chunk in client.completion_stream(payload):
        if ttft is None and (chunk.get("content") or chunk.get("tokens")):
            ttft = 1000.0 * (time.perf_counter() - started)
        content.append(chunk.get("content") or "")
        tokens.extend(int(t) for t in chunk.get("tokens") or ())
        if chunk.get("stop") or "timings" in chunk:
            final = chunk
    latency = 1000.0 * (time.perf_counter() - started)
    resp: dict[str, Any] = {
        "content": "".join(content),
        "tokens": tokens,
        "timings": final.get("timings") or {},
        "stop_type": final.get("stop_type"),
    }
    for key in ("tokens_evaluated", "truncated"):
        if key in final:
            resp[key] = final[key]
    return resp, ttft, latency


def run_pass(
    clients: Sequence[ServerClient],
    jobs: Sequence[Sequence[Job]],
    send: Callable[[ServerClient, Job], tuple[dict[str, Any], float | None, float]],
) -> tuple[list[Answer[Job]], float]:
    """Client k sends jobs[k] in order, all clients at once. Returns (answers in completion order, wall s
    from the first request sent to the last answer). The first failure stops every client and is raised."""
    answers: list[Answer[Job]] = []
    lock = threading.Lock()
    failed: list[BaseException] = []
    stop = threading.Event()
    barrier = threading.Barrier(len(clients))

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for job in jobs[k]:
                if stop.is_set():
                    return
                t0 = time.perf_counter()
                resp, ttft, latency = send(clients[k], job)
                answer = Answer(k, job, resp, ttft, latency, t0, time.perf_counter())
                with lock:
                    answers.append(answer)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            with lock:
                failed.append(e)
            stop.set()
            barrier.abort()

    # daemon threads joined with a timeout: Ctrl-C reaches the main thread at once, and the caller's
    # server shutdown then ends the requests still in flight
    threads = [
        threading.Thread(target=worker, args=(k,), daemon=True, name=f"dspark-client-{k}") for k in range(len(clients))
    ]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.1)
    except BaseException:
        stop.set()
        raise
    real = [e for e in failed if not isinstance(e, threading.BrokenBarrierError)]
    if real or failed:
        raise (real or failed)[0]
    wall = max(a.end_s for a in answers) - min(a.start_s for a in answers) if answers else 0.0
    return answers, wall


def rotated(items: Sequence[Job], k: int, n: int) -> list[Job]:
    """Client k of n starts its pass at its own place in the kit: the clients are never all on the same
    prompt, and every prompt is asked n times per pass."""
    start = (k * len(items)) // n if n else 0
    return [*items[start:], *items[:start]]
