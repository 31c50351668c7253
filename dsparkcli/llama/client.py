"""ServerClient: HTTP calls to a running llama-server (dspark's own or the user's ``--server URL``), one
``ServerError`` per failure (no connection, HTTP status, lost stream); ``stream_chat``: one streamed chat request
timed (TTFT, wall); ``metrics_or_none`` for a server started without --metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from dsparkcli.errors import ServerError
from dsparkcli.llama import protocol


class ServerClient:
    """HTTP calls to a running llama-server (ours or the user's ``--server URL``)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 600.0) -> None:
        import httpx  # deferred: ~0.1 s that commands which never talk to a server do not pay

        self._httpx = httpx
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=5.0))

    def close(self) -> None:
        self._http.close()

    def _raise_for(self, resp: Any, what: str) -> None:
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("error", {}).get("message", "") or resp.text
            except ValueError:
                detail = resp.text
            hint = "check --api-key" if resp.status_code == 401 else None
            raise ServerError(
                f"{what} failed with HTTP {resp.status_code}: {' '.join(str(detail).split())[:300]}",
                kind="http",
                hint=hint,
            )

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return self._http.request(method, path, **kw)
        except (self._httpx.ConnectError, self._httpx.ConnectTimeout) as e:
            raise self._no_connection(e) from e
        except self._httpx.TransportError as e:
            raise ServerError(
                f"cannot reach llama-server at {self.base_url}{path}: {e.__class__.__name__}: {e}", kind="crash"
            ) from e

    def _no_connection(self, e: Exception) -> ServerError:
        """Nothing accepted the connection: no request was sent, so nothing was "lost during generation"."""
        return ServerError(
            f"could not connect to {self.base_url}: {e.__class__.__name__}: {e}",
            kind="crash",
            hint="is a llama-server running there? `dspark serve` starts one",
        )

    def health(self) -> int:
        return self._request("GET", "/health").status_code

    def props(self) -> dict[str, Any]:
        resp = self._request("GET", "/props")
        self._raise_for(resp, "GET /props")
        return resp.json()

    def completion(self, payload: dict[str, Any]) -> dict[str, Any]:
        resp = self._request("POST", "/completion", json=payload)
        self._raise_for(resp, "POST /completion")
        return resp.json()

    def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        resp = self._request("POST", "/v1/chat/completions", json={**payload, "stream": False})
        self._raise_for(resp, "POST /v1/chat/completions")
        return resp.json()

    def chat_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Yield each streamed chunk (parsed SSE ``data:`` lines) until ``[DONE]``."""
        return self._sse("/v1/chat/completions", {**payload, "stream": True})

    def completion_stream(self, payload: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Yield each streamed /completion chunk (one per token; the last has ``stop`` and ``timings``)."""
        return self._sse("/completion", {**payload, "stream": True})

    def _sse(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        # Connection: close. Under concurrent load, llama-server (0c1e570) drops some requests sent on a
        # keep-alive connection that has just carried a stream ("Server disconnected without sending a
        # response": 21 of 240 with 8 clients on -np 4, none with a fresh connection; docs/DESIGN.md)
        try:
            with self._http.stream("POST", path, json=body, headers={"Connection": "close"}) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._raise_for(resp, f"POST {path}")
                for line in resp.iter_lines():
                    data = protocol.sse_data(line)
                    if data is None:
                        continue
                    if data == protocol.SSE_DONE:
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise ServerError(f"llama-server error: {chunk['error']}", kind="http")
                    yield chunk
        except (self._httpx.ConnectError, self._httpx.ConnectTimeout) as e:
            raise self._no_connection(e) from e
        except self._httpx.TransportError as e:
            raise ServerError(
                f"connection to llama-server lost during generation: {e.__class__.__name__}", kind="crash"
            ) from e

    def apply_template(
        self, messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any] | None = None
    ) -> str:
        """The prompt text the server's chat template makes of these messages."""
        body: dict[str, Any] = {"messages": messages}
        if chat_template_kwargs:  # e.g. {"enable_thinking": False}
            body["chat_template_kwargs"] = chat_template_kwargs
        resp = self._request("POST", "/apply-template", json=body)
        self._raise_for(resp, "POST /apply-template")
        return str(resp.json()["prompt"])

    def tokenize(self, text: str) -> list[int]:
        resp = self._request("POST", "/tokenize", json={"content": text})
        self._raise_for(resp, "POST /tokenize")
        return list(resp.json()["tokens"])

    def metrics(self) -> dict[str, float]:
        resp = self._request("GET", "/metrics")
        self._raise_for(resp, "GET /metrics")
        return protocol.parse_metrics(resp.text)


def metrics_or_none(client: ServerClient) -> dict[str, float] | None:
    try:
        return client.metrics()
    except ServerError:
        return None  # a user's server started without --metrics


def stream_chat(
    client: ServerClient,
    payload: dict[str, Any],
    *,
    on_text: Callable[[str], None] | None = None,
) -> tuple[str, dict[str, Any], str | None, float, float]:
    """Send one streamed chat request. Returns (text, timings, finish_reason, ttft_s, wall_s)."""
    parts: list[str] = []
    timings: dict[str, Any] = {}
    finish: str | None = None
    started = time.perf_counter()
    ttft = 0.0
    for chunk in client.chat_stream(payload):
        if "timings" in chunk:
            timings = chunk["timings"]
        pieces, chunk_finish = protocol.chunk_text(chunk)
        for delta in pieces:
            if not parts:
                ttft = time.perf_counter() - started
            parts.append(delta)
            if on_text:
                on_text(delta)
        finish = chunk_finish or finish
    wall = time.perf_counter() - started
    return "".join(parts), timings, finish, ttft, wall
