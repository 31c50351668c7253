"""The JSONL records of `dspark bench`, typed: one frozen class per record kind, each with
``to_record`` (the exact JSON object written, schema unchanged) and ``from_record`` (tolerant of the
fields older or hand-made records lack). The summary rows' classes are bench/summaries.py; the
line-per-record file I/O is bench/jsonl.py.

Kinds (field ``record``): ``prompt``, ``request``, ``counters``, ``summary``, ``overhead``; a run with
``--concurrency`` writes ``pass`` and ``load_summary`` instead of ``summary``, and its request and
counters records carry ``concurrency`` (requests also ``client`` and ``ttft_ms``). Every line also
carries ``run_id`` and ``provenance``, which the writer adds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsparkcli.bench.summaries import LoadSummaryRecord, SummaryRecord
from dsparkcli.llama.protocol import SpecCounters, TypeCounters

PLAIN = "plain"  # the configuration without a draft


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: str
    category: str
    rendered: str  # the templated text sent to /completion
    images_sha256: tuple[str, ...]
    media_marker: str

    def to_record(self) -> dict[str, Any]:
        return {
            "record": "prompt",
            "prompt_id": self.prompt_id,
            "category": self.category,
            "rendered": self.rendered,
            "images_sha256": list(self.images_sha256),
            "media_marker": self.media_marker,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PromptRecord:
        return cls(
            rec["prompt_id"],
            rec["category"],
            rec["rendered"],
            tuple(rec.get("images_sha256") or ()),
            rec.get("media_marker", ""),
        )


@dataclass(frozen=True)
class Identity:
    """How one draft request's output compares with plain decoding of the same prompt and rep."""

    identical_to_plain: bool
    first_divergence: int | None
    plain_sha256: str | None


@dataclass(frozen=True)
class RequestRecord:
    config: str
    category: str
    prompt_id: str
    rep: int
    n_predicted: int
    predicted_ms: float
    draft: str | None = None
    budget: int | None = None
    synthetic: bool = False
    synth_len: float | None = None
    prompt_n: int = 0
    prompt_ms: float | None = None
    tok_s: float | None = None
    request_ms: float = 0.0
    draft_n: int = 0
    draft_n_accepted: int = 0
    stop_type: str | None = None
    truncated: bool | None = None
    tokens: tuple[int, ...] = ()
    tokens_sha256: str = ""
    output_sha256: str = ""
    server_argv: tuple[str, ...] = ()
    identity: Identity | None = None  # None for plain decoding (nothing to compare with)
    # a --concurrency run: how many clients were in flight, which one sent it, its first token's delay
    # (client side, streamed); request_ms is then the end-to-end latency of a streamed request
    concurrency: int | None = None
    client: int | None = None
    ttft_ms: float | None = None
    request_n_max: int | None = None  # its own speculative.n_max: a larger budget's server ran it (bench.servers)

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "record": "request",
            "config": self.config,
            "draft": self.draft,
            "budget": self.budget,
            "synthetic": self.synthetic,
            "synth_len": self.synth_len,
            "category": self.category,
            "prompt_id": self.prompt_id,
            "rep": self.rep,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "n_predicted": self.n_predicted,
            "predicted_ms": self.predicted_ms,
            "tok_s": self.tok_s,
            "request_ms": self.request_ms,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
            "stop_type": self.stop_type,
            "truncated": self.truncated,
            "tokens": list(self.tokens),
            "tokens_sha256": self.tokens_sha256,
            "output_sha256": self.output_sha256,
            "server_argv": list(self.server_argv),
        }
        if self.identity is not None:
            rec.update(
                {
                    "identical_to_plain": self.identity.identical_to_plain,
                    "first_divergence": self.identity.first_divergence,
                    "plain_sha256": self.identity.plain_sha256,
                }
            )
        if self.concurrency is not None:
            rec.update({"concurrency": self.concurrency, "client": self.client, "ttft_ms": self.ttft_ms})
        rec.update({"request_n_max": self.request_n_max} if self.request_n_max is not None else {})
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> RequestRecord:
        identity = None
        if "identical_to_plain" in rec or "first_divergence" in rec:
            identity = Identity(
                rec.get("identical_to_plain") is not False, rec.get("first_divergence"), rec.get("plain_sha256")
            )
        return cls(
            config=rec["config"],
            category=rec["category"],
            prompt_id=rec["prompt_id"],
            rep=rec["rep"],
            n_predicted=rec["n_predicted"],
            predicted_ms=rec["predicted_ms"],
            draft=rec.get("draft"),
            budget=rec.get("budget"),
            synthetic=bool(rec.get("synthetic")),
            synth_len=rec.get("synth_len"),
            prompt_n=rec.get("prompt_n", 0),
            prompt_ms=rec.get("prompt_ms"),
            tok_s=rec.get("tok_s"),
            request_ms=rec.get("request_ms", 0.0),
            draft_n=rec.get("draft_n", 0),
            draft_n_accepted=rec.get("draft_n_accepted", 0),
            stop_type=rec.get("stop_type"),
            truncated=rec.get("truncated"),
            tokens=tuple(rec.get("tokens") or ()),
            tokens_sha256=rec.get("tokens_sha256", ""),
            output_sha256=rec.get("output_sha256", ""),
            server_argv=tuple(rec.get("server_argv") or ()),
            identity=identity,
            concurrency=rec.get("concurrency"),
            client=rec.get("client"),
            ttft_ms=rec.get("ttft_ms"),
            request_n_max=rec.get("request_n_max"),
        )


@dataclass(frozen=True)
class CountersRecord:
    """/metrics deltas over one (rep, category) block of one draft configuration (category ``all``: a pass of a
    --concurrency run)."""

    config: str
    category: str
    rep: int
    counters: SpecCounters
    draft: str | None = None
    budget: int | None = None
    synthetic: bool = False
    server_argv: tuple[str, ...] = ()
    concurrency: int | None = None  # a --concurrency run: one block per pass (category ``all``)
    # a chain (ngram-mod+dspark): each type's share of ``counters`` (llama.protocol.type_stats); written only
    # where read, so the records of a single type are as before
    by_type: tuple[TypeCounters, ...] = ()

    def to_record(self) -> dict[str, Any]:
        rec = {
            "record": "counters",
            "config": self.config,
            "draft": self.draft,
            "budget": self.budget,
            "category": self.category,
            "rep": self.rep,
            **self.counters.to_record(),
            "synthetic": self.synthetic,
            "server_argv": list(self.server_argv),
        }
        if self.concurrency is not None:
            rec["concurrency"] = self.concurrency
        if self.by_type:
            rec["by_type"] = [t.to_record() for t in self.by_type]
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> CountersRecord:
        return cls(
            config=rec["config"],
            category=rec["category"],
            rep=rec["rep"],
            counters=SpecCounters.from_record(rec),
            draft=rec.get("draft"),
            budget=rec.get("budget"),
            synthetic=bool(rec.get("synthetic")),
            server_argv=tuple(rec.get("server_argv") or ()),
            concurrency=rec.get("concurrency"),
            by_type=tuple(TypeCounters.from_record(t) for t in rec.get("by_type") or ()),
        )


@dataclass(frozen=True)
class PassRecord:
    """One timed pass of a --concurrency run: every client through the prompt kit once, all in flight
    together; aggregate tok/s = tokens / wall (first request sent to last answer received)."""

    config: str
    concurrency: int
    rep: int
    requests: int
    tokens: int
    wall_s: float
    draft: str | None = None
    budget: int | None = None
    synthetic: bool = False

    @property
    def tok_s(self) -> float | None:
        return self.tokens / self.wall_s if self.wall_s > 0 else None

    def to_record(self) -> dict[str, Any]:
        return {
            "record": "pass",
            "config": self.config,
            "draft": self.draft,
            "budget": self.budget,
            "synthetic": self.synthetic,
            "concurrency": self.concurrency,
            "rep": self.rep,
            "requests": self.requests,
            "tokens": self.tokens,
            "wall_s": self.wall_s,
            "tok_s": self.tok_s,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> PassRecord:
        """The measured parts (tok/s is derived from them, not read)."""
        return cls(
            config=rec["config"],
            concurrency=rec["concurrency"],
            rep=rec["rep"],
            requests=rec["requests"],
            tokens=rec["tokens"],
            wall_s=rec["wall_s"],
            draft=rec.get("draft"),
            budget=rec.get("budget"),
            synthetic=bool(rec.get("synthetic")),
        )


@dataclass(frozen=True)
class OverheadRecord:
    wall_s: float  # the whole bench, servers' start and stop included
    # Σ server-side prompt + generation time of every request (warm-up included); in a --concurrency
    # run, where requests overlap, Σ wall time of the passes and warm-ups instead
    generation_s: float
    load_s: float  # Σ time to healthy, one load per configuration
    request_s: float  # Σ client-side round trips (generation + the server's untimed work + HTTP)
    provenance_s: float  # part of wall spent waiting for the file sha256s
    stop_s: float  # part of wall: Σ server shutdowns
    configurations: int
    requests: int
    synthetic: bool

    @property
    def ratio(self) -> float:
        """wall / (generation + load)."""
        denom = self.generation_s + self.load_s
        return self.wall_s / denom if denom > 0 else float("inf")

    @property
    def ratio_after_hashing(self) -> float:
        """The ratio without the one-time provenance hashing (what a re-run with a warm hash cache sees)."""
        denom = self.generation_s + self.load_s
        return (self.wall_s - self.provenance_s) / denom if denom > 0 else float("inf")

    def to_record(self) -> dict[str, Any]:
        return {
            "record": "overhead",
            "wall_s": self.wall_s,
            "generation_s": self.generation_s,
            "load_s": self.load_s,
            "request_s": self.request_s,
            "provenance_s": self.provenance_s,
            "stop_s": self.stop_s,
            "ratio": self.ratio,
            "ratio_after_hashing": self.ratio_after_hashing,
            "configurations": self.configurations,
            "requests": self.requests,
            "synthetic": self.synthetic,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> OverheadRecord:
        """The measured parts (the ratios are derived from them, not read)."""
        return cls(
            wall_s=rec["wall_s"],
            generation_s=rec["generation_s"],
            load_s=rec["load_s"],
            request_s=rec["request_s"],
            provenance_s=rec.get("provenance_s", 0.0),
            stop_s=rec.get("stop_s", 0.0),
            configurations=rec.get("configurations", 0),
            requests=rec.get("requests", 0),
            synthetic=bool(rec.get("synthetic")),
        )

    def figures(self) -> dict[str, float]:
        """The --json document's ``overhead`` block."""
        return {
            "wall_s": self.wall_s,
            "generation_s": self.generation_s,
            "load_s": self.load_s,
            "request_s": self.request_s,
            "provenance_s": self.provenance_s,
            "stop_s": self.stop_s,
            "ratio": self.ratio,
            "ratio_after_hashing": self.ratio_after_hashing,
        }


RECORD_TYPES: dict[str, Any] = {
    "prompt": PromptRecord,
    "request": RequestRecord,
    "counters": CountersRecord,
    "summary": SummaryRecord,
    "overhead": OverheadRecord,
    "pass": PassRecord,
    "load_summary": LoadSummaryRecord,
}
Record = (
    PromptRecord | RequestRecord | CountersRecord | SummaryRecord | OverheadRecord | PassRecord | LoadSummaryRecord
)


def from_record(rec: Mapping[str, Any]) -> Record:
    """The typed record of one JSON object (by its ``record`` field); run_id and provenance are not part of it."""
    kind = rec.get("record")
    if kind not in RECORD_TYPES:
        raise ValueError(f"not a bench record: record={kind!r}")
    return RECORD_TYPES[kind].from_record(rec)


def measured(records: Sequence[Mapping[str, Any]]) -> tuple[list[RequestRecord], list[CountersRecord]]:
    """The request and counters records among any records (others are ignored)."""
    requests = [RequestRecord.from_record(r) for r in records if r.get("record") == "request"]
    counters = [CountersRecord.from_record(r) for r in records if r.get("record") == "counters"]
    return requests, counters


# the line-per-record files (kept importable from here: bench, the scripts and the tests read them so)
from dsparkcli.bench.jsonl import JsonlSink, dumps, iter_jsonl, read_jsonl  # noqa: E402

__all__ = ["JsonlSink", "dumps", "iter_jsonl", "read_jsonl"]
