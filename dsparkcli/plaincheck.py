"""`dspark run --compare`: the drafted answer against plain decoding of the same question.

Greedy speculative decoding should reproduce plain greedy decoding, but llama.cpp does not guarantee it:
a verification step runs k+1 rows through the kernels where plain decoding runs one, and on a quantised
target the rounding of a near-tie can go the other way (llama.cpp docs/speculative.md; BENCHMARKS.md
measured it on the H200: the target's top-2 margin at first divergences had a median of 0.22 logits,
against 2.43 over all positions). So the comparison does not stop at "differs": plain runs once more
with the target's top-2 log-probabilities, and the first divergence is reported with them — a near-tie
is the engine's rounding; a clear winner that the draft run did not pick would be a bug worth reporting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dsparkcli.llama import protocol
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import LlamaServer, ServerConfig

# below this top-1/top-2 log-probability margin (= logit margin) a divergence is rounding of a near-tie:
# the H200 study's first divergences had a 90th percentile of 0.50 (study/results/h200/real/divergence-margins.json)
NEAR_TIE = 0.5
TOP = 2  # the target's candidates asked per position


@dataclass(frozen=True)
class Divergence:
    index: int  # token position in plain's answer where the drafted answer leaves it
    plain_token: str  # plain's token there ("" when plain ended first)
    draft_continues: str  # the drafted answer from that point (a few characters)
    top: tuple[tuple[str, float], ...]  # the target's candidates there: (token, logprob), best first

    @property
    def margin(self) -> float | None:
        return self.top[0][1] - self.top[1][1] if len(self.top) >= 2 else None

    @property
    def near_tie(self) -> bool:
        return self.margin is not None and self.margin < NEAR_TIE


@dataclass(frozen=True)
class PlainComparison:
    identical: bool
    plain_tokens: int
    plain_decode_tok_s: float
    divergence: Divergence | None

    def message(self) -> str:
        if self.identical:
            return (
                f"identical to plain decoding ({self.plain_tokens} tokens, plain {self.plain_decode_tok_s:.1f} tok/s)"
            )
        d = self.divergence
        assert d is not None
        at = f"from token {d.index}" if d.index >= 0 else "(the server gave no per-token detail)"
        where = f"differs from plain decoding {at}: plain {d.plain_token!r}, drafted {d.draft_continues!r}"
        if not d.top or d.margin is None:
            return where + " (plain ended there)" if not d.plain_token else where
        cands = ", ".join(f"{t!r} {lp:.2f}" for t, lp in d.top)
        if d.near_tie:
            return (
                f"{where}; the target's top-2 there ({cands}; log-probabilities) are {d.margin:.2f} apart: a near-tie "
                "that batched verification rounds differently from one-token decoding (llama.cpp does not "
                "promise identical output)"
            )
        return (
            f"{where}; the target's top-2 there ({cands}; log-probabilities) are {d.margin:.2f} apart: NOT a "
            "near-tie — please report it with `dspark doctor` output"
        )

    def to_record(self) -> dict[str, Any]:
        d = self.divergence
        return {
            "identical": self.identical,
            "plain_tokens": self.plain_tokens,
            "plain_decode_tok_s": self.plain_decode_tok_s,
            "divergence": None
            if d is None
            else {
                "index": d.index,
                "plain_token": d.plain_token,
                "draft_continues": d.draft_continues,
                "top": [list(c) for c in d.top],
                "margin": d.margin,
                "near_tie": d.near_tie,
            },
        }


def _token_bytes(entry: dict[str, Any]) -> bytes:
    b = entry.get("bytes")
    return bytes(b) if isinstance(b, list) else str(entry.get("token", "")).encode()


def first_divergence(draft_text: str, plain: Sequence[dict[str, Any]]) -> Divergence | None:
    """Where ``draft_text`` leaves plain's tokens (llama-server's ``logprobs.content`` entries: token,
    bytes, top_logprobs), compared byte by byte; None when they are the same text."""
    drafted = draft_text.encode()
    at = 0
    for i, entry in enumerate(plain):
        tok = _token_bytes(entry)
        if drafted[at : at + len(tok)] != tok:
            top = tuple(
                (str(c.get("token", "")), float(c.get("logprob", 0.0))) for c in entry.get("top_logprobs") or ()
            )
            return Divergence(i, str(entry.get("token", "")), drafted[at : at + 24].decode(errors="replace"), top)
        at += len(tok)
    if at < len(drafted):  # plain stopped (end of generation) where the drafted answer goes on
        return Divergence(len(plain), "", drafted[at : at + 24].decode(errors="replace"), ())
    return None


def plain_config(cfg: ServerConfig) -> ServerConfig:
    """The same server without its draft (and without anything that only a draft uses)."""
    return replace(
        cfg,
        draft=None,
        spec_type=None,
        n_max=None,
        n_min=None,
        p_min=None,
        synth_len=None,
        synth_rates=None,
        cost_table=None,
    )


def compare_with_plain(
    engine: Engine,
    cfg: ServerConfig,
    messages: list[dict[str, Any]],
    draft_text: str,
    *,
    max_tokens: int,
    seed: int | None,
) -> PlainComparison:
    """Ask plain decoding (a server without the draft) the same greedy question, with the target's top-2
    log-probabilities, and compare."""
    payload = protocol.chat_payload(messages, max_tokens=max_tokens, temp=0.0, seed=seed, stream=False)
    payload |= {"logprobs": True, "top_logprobs": TOP}
    with LlamaServer(engine, plain_config(cfg)) as srv:
        assert srv.client is not None
        resp = srv.client.chat(payload)
    choice = (resp.get("choices") or [{}])[0]
    content = ((choice.get("logprobs") or {}).get("content")) or []
    text = (choice.get("message") or {}).get("content") or ""
    timings = resp.get("timings") or {}
    div = None if text == draft_text else first_divergence(draft_text, content)
    if div is None and text != draft_text:  # no per-token detail to place it (an engine without logprobs)
        common = next((i for i, (a, b) in enumerate(zip(text, draft_text)) if a != b), min(len(text), len(draft_text)))
        div = Divergence(-1, text[common : common + 24], draft_text[common : common + 24], ())
    return PlainComparison(
        identical=div is None and text == draft_text,
        plain_tokens=len(content),
        plain_decode_tok_s=float(timings.get("predicted_per_second", 0.0)),
        divergence=div,
    )
