"""The summary rows of `dspark bench`, typed, from ``bench.stats`` to every report format and to tune: one
frozen class per row kind, each with ``to_record`` (the exact JSON object written: the JSONL ``summary`` and
``load_summary`` lines and the --json document's ``summaries``, schema unchanged) and ``from_record`` (a written
line read back: tune's phases, a stored tuning's refit).

``SummaryRecord``: one configuration x category (and ``all``, every category together); ``LoadSummaryRecord``:
one configuration at one concurrency (a --concurrency run); a draft configuration's rows add a ``DraftSummary``
(acceptance and identity vs plain decoding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsparkcli.llama.protocol import SpecCounters, TypeCounters

ALL = "all"  # the summary category over every category


@dataclass(frozen=True)
class Spread:
    """Median, min and max of some values (all None for none)."""

    median: float | None = None
    min: float | None = None
    max: float | None = None

    def to_record(self) -> dict[str, float | None]:
        return {"median": self.median, "min": self.min, "max": self.max}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Spread:
        return cls(rec.get("median"), rec.get("min"), rec.get("max"))


@dataclass(frozen=True)
class Quantiles:
    """p50, p95 (nearest rank: a value that was observed) and max of some values (all None for none)."""

    p50: float | None = None
    p95: float | None = None
    max: float | None = None

    def to_record(self) -> dict[str, float | None]:
        return {"p50": self.p50, "p95": self.p95, "max": self.max}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Quantiles:
        return cls(rec.get("p50"), rec.get("p95"), rec.get("max"))


@dataclass(frozen=True)
class Divergence:
    prompt_id: str
    first_divergence: int | None
    output_sha256: str
    plain_sha256: str | None

    def to_record(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "first_divergence": self.first_divergence,
            "output_sha256": self.output_sha256,
            "plain_sha256": self.plain_sha256,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Divergence:
        return cls(
            rec["prompt_id"], rec.get("first_divergence"), rec.get("output_sha256", ""), rec.get("plain_sha256")
        )


@dataclass(frozen=True)
class DraftSummary:
    """What a draft configuration's summary adds to plain's: acceptance and identity."""

    counters: SpecCounters
    timings_drafted: int
    timings_accepted: int
    identical: int
    prompts: int
    divergent: tuple[Divergence, ...]
    # Requests that drafted after the last /metrics read (a run interrupted inside a block): their drafted /
    # accepted come from their own timings; steps and positions are unknown, so mean length and the
    # per-position shares cover the counted blocks only.
    uncounted: SpecCounters = SpecCounters()
    uncounted_requests: int = 0
    # a chain's counted blocks per type (which type proposed: ngram-mod, draft-dspark); empty for one type
    by_type: tuple[TypeCounters, ...] = ()

    @property
    def total(self) -> SpecCounters:
        """Drafted and accepted with the uncounted requests' (steps and positions: the counted blocks')."""
        return self.counters.plus(self.uncounted)

    @property
    def identical_pct(self) -> float | None:
        return 100.0 * self.identical / self.prompts if self.prompts else None

    @property
    def acceptance_per_pos(self) -> list[float]:
        steps = self.counters.steps
        return [v / steps for v in self.counters.accepted_per_pos] if steps else []

    def to_record(self) -> dict[str, Any]:
        c, all_ = self.counters, self.total
        rec = {
            "drafted": all_.drafted,
            "accepted": all_.accepted,
            "steps": c.steps,
            "acceptance_rate": all_.acceptance_rate,
            "mean_length": c.mean_length,
            "accepted_per_pos": list(c.accepted_per_pos),
            "acceptance_per_pos": self.acceptance_per_pos,
            "timings_drafted": self.timings_drafted,
            "timings_accepted": self.timings_accepted,
            "identical": self.identical,
            "prompts": self.prompts,
            "identical_pct": self.identical_pct,
            "divergent": [d.to_record() for d in self.divergent],
        }
        if self.uncounted_requests:
            rec.update(
                {
                    "uncounted_requests": self.uncounted_requests,
                    "uncounted_drafted": self.uncounted.drafted,
                    "uncounted_accepted": self.uncounted.accepted,
                }
            )
        if self.by_type:
            rec["by_type"] = [t.to_record() for t in self.by_type]
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> DraftSummary:
        """From a summary row (rate, mean length and per-position shares are derived, not read)."""
        uncounted = SpecCounters(
            drafted=int(rec.get("uncounted_drafted", 0)), accepted=int(rec.get("uncounted_accepted", 0))
        )
        counted = SpecCounters.from_record(rec)
        counted = SpecCounters(
            drafted=counted.drafted - uncounted.drafted,
            accepted=counted.accepted - uncounted.accepted,
            steps=counted.steps,
            accepted_per_pos=counted.accepted_per_pos,
        )
        return cls(
            counters=counted,
            timings_drafted=rec.get("timings_drafted", 0),
            timings_accepted=rec.get("timings_accepted", 0),
            identical=rec.get("identical", 0),
            prompts=rec.get("prompts", 0),
            divergent=tuple(Divergence.from_record(d) for d in rec.get("divergent") or ()),
            uncounted=uncounted,
            uncounted_requests=int(rec.get("uncounted_requests", 0)),
            by_type=tuple(TypeCounters.from_record(t) for t in rec.get("by_type") or ()),
        )


@dataclass(frozen=True)
class SummaryRecord:
    """The figures the report shows for one configuration × category (or ``all``)."""

    config: str
    category: str
    draft: str | None
    budget: int | None
    synthetic: bool
    synth_len: float | None
    prompts: int
    reps: int
    requests: int
    tokens: int
    tok_s: Spread
    speedup: float | None
    upstream_acceptance_length: float | None
    drafting: DraftSummary | None = None  # None for plain decoding
    load_s: float | None = None  # on the ``all`` row of a measured run: time to healthy

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "record": "summary",
            "config": self.config,
            "draft": self.draft,
            "budget": self.budget,
            "category": self.category,
            "synthetic": self.synthetic,
            "synth_len": self.synth_len,
            "prompts": self.prompts,
            "reps": self.reps,
            "requests": self.requests,
            "tokens": self.tokens,
            "tok_s": self.tok_s.to_record(),
            "speedup": self.speedup,
            "upstream_acceptance_length": self.upstream_acceptance_length,
        }
        if self.drafting is not None:
            rec.update(self.drafting.to_record())
        if self.load_s is not None:
            rec["load_s"] = self.load_s
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> SummaryRecord:
        return cls(
            config=rec["config"],
            category=rec["category"],
            draft=rec.get("draft"),
            budget=rec.get("budget"),
            synthetic=bool(rec.get("synthetic")),
            synth_len=rec.get("synth_len"),
            prompts=rec.get("prompts", 0),
            reps=rec.get("reps", 0),
            requests=rec.get("requests", 0),
            tokens=rec.get("tokens", 0),
            tok_s=Spread.from_record(rec.get("tok_s") or {}),
            speedup=rec.get("speedup"),
            upstream_acceptance_length=rec.get("upstream_acceptance_length"),
            drafting=DraftSummary.from_record(rec) if "drafted" in rec else None,
            load_s=rec.get("load_s"),
        )


@dataclass(frozen=True)
class LoadSummaryRecord:
    """The figures of one configuration at one concurrency (every category together)."""

    config: str
    concurrency: int
    draft: str | None
    budget: int | None
    synthetic: bool
    synth_len: float | None
    prompts: int
    reps: int
    requests: int
    tokens: int
    tok_s: Spread  # aggregate: over passes
    request_tok_s: Spread  # per request, server-side decode rate (timings.predicted_per_second)
    ttft_ms: Quantiles  # client side, streamed: request sent -> first token
    latency_ms: Quantiles  # client side: request sent -> last byte
    speedup: float | None  # median aggregate tok/s / plain's at the same concurrency
    drafting: DraftSummary | None = None  # None for plain decoding; identity vs plain at the same concurrency
    load_s: float | None = None

    @property
    def category(self) -> str:
        """Every category together, as its line says: a load row is an ``all`` row."""
        return ALL

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "record": "load_summary",
            "config": self.config,
            "draft": self.draft,
            "budget": self.budget,
            "concurrency": self.concurrency,
            "category": self.category,
            "synthetic": self.synthetic,
            "synth_len": self.synth_len,
            "prompts": self.prompts,
            "reps": self.reps,
            "requests": self.requests,
            "tokens": self.tokens,
            "tok_s": self.tok_s.to_record(),
            "request_tok_s": self.request_tok_s.to_record(),
            "ttft_ms": self.ttft_ms.to_record(),
            "latency_ms": self.latency_ms.to_record(),
            "speedup": self.speedup,
        }
        if self.drafting is not None:
            rec.update(self.drafting.to_record())
        if self.load_s is not None:
            rec["load_s"] = self.load_s
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> LoadSummaryRecord:
        return cls(
            config=rec["config"],
            concurrency=rec["concurrency"],
            draft=rec.get("draft"),
            budget=rec.get("budget"),
            synthetic=bool(rec.get("synthetic")),
            synth_len=rec.get("synth_len"),
            prompts=rec.get("prompts", 0),
            reps=rec.get("reps", 0),
            requests=rec.get("requests", 0),
            tokens=rec.get("tokens", 0),
            tok_s=Spread.from_record(rec.get("tok_s") or {}),
            request_tok_s=Spread.from_record(rec.get("request_tok_s") or {}),
            ttft_ms=Quantiles.from_record(rec.get("ttft_ms") or {}),
            latency_ms=Quantiles.from_record(rec.get("latency_ms") or {}),
            speedup=rec.get("speedup"),
            drafting=DraftSummary.from_record(rec) if "drafted" in rec else None,
            load_s=rec.get("load_s"),
        )


Summary = SummaryRecord | LoadSummaryRecord
SUMMARY_TYPES: dict[str, type[SummaryRecord] | type[LoadSummaryRecord]] = {
    "summary": SummaryRecord,
    "load_summary": LoadSummaryRecord,
}


def written_summaries(records: Iterable[Mapping[str, Any]]) -> list[Summary]:
    """The summary rows among written records, typed (other records are ignored)."""
    return [SUMMARY_TYPES[r["record"]].from_record(r) for r in records if r.get("record") in SUMMARY_TYPES]
