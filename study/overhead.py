"""dspark's own cost on one request: its streamed-chat client (`llama.client.stream_chat`, what `run` uses) vs a bare HTTP client, same server, same request.

Both sides send the identical streamed chat request, interleaved, ``reps`` times each. Compared:
the decode tok/s llama-server reports in ``timings`` (does dspark slow generation down, e.g. by
reading the stream too slowly?) and the client-side time to first token.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from dsparkcli.llama import protocol
from dsparkcli.llama.client import ServerClient, stream_chat

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class OverheadResult:
    reps: int
    n_predict: int
    bare_decode_tok_s: tuple[float, ...]
    dspark_decode_tok_s: tuple[float, ...]
    bare_ttft_s: tuple[float, ...]
    dspark_ttft_s: tuple[float, ...]

    @property
    def decode_ratio(self) -> float:
        """median(dspark) / median(bare): >= 0.99 means dspark costs generation at most 1 %."""
        return statistics.median(self.dspark_decode_tok_s) / statistics.median(self.bare_decode_tok_s)

    @property
    def ttft_delta_s(self) -> float:
        return statistics.median(self.dspark_ttft_s) - statistics.median(self.bare_ttft_s)

    @property
    def decode_ratio_best(self) -> float:
        """max(dspark) / max(bare): interference from other processes only slows a run down, so the
        fastest of each side is the robust comparison on a busy machine."""
        return max(self.dspark_decode_tok_s) / max(self.bare_decode_tok_s)

    @property
    def ttft_delta_best_s(self) -> float:
        return min(self.dspark_ttft_s) - min(self.bare_ttft_s)

    def to_record(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "decode_ratio": self.decode_ratio,
            "ttft_delta_s": self.ttft_delta_s,
            "decode_ratio_best": self.decode_ratio_best,
            "ttft_delta_best_s": self.ttft_delta_best_s,
        }


def bare_request(http: httpx.Client, payload: dict[str, Any]) -> tuple[float, float]:
    """A minimal client: raw SSE lines, no parsing beyond what it takes to find timings (deliberately not
    ``llama.protocol``'s SSE handling: this is the baseline dspark's client is measured against).

    Returns (server-reported decode tok/s, client time to first content chunk).
    """
    started = time.perf_counter()
    ttft = 0.0
    timings: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=payload) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if not ttft and '"content":"' in line:
                ttft = time.perf_counter() - started
            if '"timings"' in line:
                timings = json.loads(line[6:]).get("timings", {})
    return float(timings.get("predicted_per_second", 0.0)), ttft


def measure(client: ServerClient, prompt: str, *, reps: int = 10, n_predict: int = 512) -> OverheadResult:
    payload = protocol.chat_payload(
        protocol.build_messages(prompt), max_tokens=n_predict, temp=0.0, seed=0, ignore_eos=True
    )
    sink = open(os.devnull, "w")  # dspark writes every streamed piece, as the CLI does to stdout
    bare_tps, bare_ttft, ds_tps, ds_ttft = [], [], [], []
    import httpx  # deferred: only a bench run measures the overhead

    http = httpx.Client(base_url=client.base_url, timeout=600)  # kept alive, like dspark's own client
    try:
        bare_request(http, payload)  # warm-up, not counted
        stream_chat(client, payload)
        for _ in range(reps):
            tps, ttft = bare_request(http, payload)
            bare_tps.append(tps)
            bare_ttft.append(ttft)
            text, timings, _, ttft, _ = stream_chat(client, payload, on_text=sink.write)
            ds_tps.append(float(timings.get("predicted_per_second", 0.0)))
            ds_ttft.append(ttft)
    finally:
        sink.close()
        http.close()
    return OverheadResult(
        reps=reps,
        n_predict=n_predict,
        bare_decode_tok_s=tuple(bare_tps),
        dspark_decode_tok_s=tuple(ds_tps),
        bare_ttft_s=tuple(bare_ttft),
        dspark_ttft_s=tuple(ds_ttft),
    )
