"""Pure statistics of a bench: spreads, speedups, token identity and the summary rows.

The same records always give the same table: ``summarize`` rebuilds from a JSONL file exactly the
summary rows a run wrote, one configuration at a time from that configuration's own records.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dsparkcli.bench.records import PLAIN, CountersRecord, PassRecord, RequestRecord, measured
from dsparkcli.bench.summaries import (
    ALL,
    Divergence,
    DraftSummary,
    LoadSummaryRecord,
    Quantiles,
    Spread,
    Summary,
    SummaryRecord,
)
from dsparkcli.llama.protocol import SpecCounters, total_by_type


def spread(values: Sequence[float], *, count: bool = False) -> dict[str, float | None]:
    """Median, min and max (and ``n`` with ``count``) as a JSON object; None for an empty sequence (the study
    kit's own figures; bench's rows hold a ``Spread``)."""
    s = spread_of(values).to_record()
    return {**s, "n": len(values)} if count else s


def spread_of(values: Sequence[float]) -> Spread:
    if not values:
        return Spread()
    return Spread(statistics.median(values), min(values), max(values))


def quantiles_of(values: Sequence[float]) -> Quantiles:
    """p50, p95 and max by nearest rank (each one a value that was observed)."""
    if not values:
        return Quantiles()
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    return Quantiles(rank(0.50), rank(0.95), ordered[-1])


def speedup(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


def ms_per_token(summaries: Iterable[Summary]) -> dict[str, dict[str, float]]:
    """config -> ms per token over all categories: ``median``, and ``lo`` / ``hi`` (the fastest and the
    slowest rep), from bench summaries; the step cost of a --spec-synth-len 1 cell (one token a step)."""
    out = {}
    for s in summaries:
        t = s.tok_s
        if isinstance(s, SummaryRecord) and s.category == ALL and t.median and t.min and t.max:
            out[s.config] = {"median": 1000.0 / t.median, "lo": 1000.0 / t.max, "hi": 1000.0 / t.min}
    return out


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first token where ``other`` leaves ``reference``; None when identical.

    When one stream is a prefix of the other, the divergence is where the shorter one ends.
    """
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    if len(reference) != len(other):
        return min(len(reference), len(other))
    return None


def tokens_sha256(tokens: Sequence[int]) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in tokens).encode()).hexdigest()


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def rep_tok_s(requests: Sequence[RequestRecord]) -> list[float]:
    """Per rep: Σ tokens / Σ generation time over the group's prompts (one "run" of the kit per rep)."""
    by_rep: dict[int, list[RequestRecord]] = {}
    for r in requests:
        by_rep.setdefault(r.rep, []).append(r)
    values = []
    for rep in sorted(by_rep):
        n = sum(r.n_predicted for r in by_rep[rep])
        ms = sum(r.predicted_ms for r in by_rep[rep])
        if ms > 0:
            values.append(1000.0 * n / ms)
    return values


def _divergences(requests: Sequence[RequestRecord]) -> tuple[int, tuple[Divergence, ...]]:
    """(prompts, divergent ones): a prompt is identical when every rep matched plain; otherwise the
    earliest divergence over its reps is reported."""
    by_prompt: dict[str, list[RequestRecord]] = {}
    for r in requests:
        by_prompt.setdefault(r.prompt_id, []).append(r)
    divergent = []
    never = 1 << 30
    for pid, reqs in by_prompt.items():
        firsts = [r.identity.first_divergence for r in reqs if r.identity and r.identity.first_divergence is not None]
        if firsts or any(r.identity is not None and not r.identity.identical_to_plain for r in reqs):
            worst = min(
                reqs,
                key=lambda r: (
                    r.identity.first_divergence if r.identity and r.identity.first_divergence is not None else never
                ),
            )
            divergent.append(
                Divergence(
                    pid,
                    min(firsts) if firsts else None,
                    worst.output_sha256,
                    worst.identity.plain_sha256 if worst.identity else None,
                )
            )
    return len(by_prompt), tuple(divergent)


def summarize_config(
    requests: Sequence[RequestRecord],
    counters: Sequence[CountersRecord],
    categories: Sequence[str],
    plain_median: Mapping[str, float | None],
    upstream: Mapping[str, float] | None = None,
) -> list[SummaryRecord]:
    """Summary rows of ONE configuration (its own request and counters records), per category and ``all``.

    Speedup is the ratio of median tok/s to plain's median tok/s for the same category (``plain_median``;
    plain's own rows use their own median).
    """
    upstream = upstream or {}
    if not requests:
        return []
    first = requests[0]
    rows = []
    for category in [*categories, ALL]:
        reqs = list(requests) if category == ALL else [r for r in requests if r.category == category]
        if not reqs:
            continue
        tok_s = spread_of(rep_tok_s(reqs))
        baseline = tok_s.median if first.config == PLAIN else plain_median.get(category)
        drafting = None
        if first.config != PLAIN:
            drafting = _drafting(reqs, [c for c in counters if category == ALL or c.category == category])
        rows.append(
            SummaryRecord(
                config=first.config,
                category=category,
                draft=first.draft,
                budget=first.budget,
                synthetic=first.synthetic,
                synth_len=first.synth_len,
                prompts=len({r.prompt_id for r in reqs}),
                reps=len({r.rep for r in reqs}),
                requests=len(reqs),
                tokens=sum(r.n_predicted for r in reqs),
                tok_s=tok_s,
                speedup=speedup(tok_s.median, baseline),
                upstream_acceptance_length=upstream.get(category) if category != ALL else None,
                drafting=drafting,
            )
        )
    return rows


def medians(rows: Iterable[SummaryRecord]) -> dict[str, float | None]:
    """category -> median tok/s: the baseline later configurations' speedups divide by."""
    return {r.category: r.tok_s.median for r in rows}


def _drafting(requests: Sequence[RequestRecord], counters: Sequence[CountersRecord]) -> DraftSummary:
    n_prompts, divergent = _divergences(requests)
    # /metrics is read once a (rep, category) block ends (once a pass ends under --concurrency): a run
    # interrupted inside a block has requests no counters record covers; their drafts are counted from
    # their own timings, not dropped (issue 28: "drafted 0" for requests that drafted 27)
    read = {(c.rep, c.category) for c in counters}
    uncounted = [r for r in requests if r.draft_n and not ({(r.rep, r.category), (r.rep, ALL)} & read)]
    return DraftSummary(
        counters=SpecCounters.total(c.counters for c in counters),
        timings_drafted=sum(r.draft_n for r in requests),
        timings_accepted=sum(r.draft_n_accepted for r in requests),
        identical=n_prompts - len(divergent),
        prompts=n_prompts,
        divergent=divergent,
        uncounted=SpecCounters(
            drafted=sum(r.draft_n for r in uncounted), accepted=sum(r.draft_n_accepted for r in uncounted)
        ),
        uncounted_requests=len(uncounted),
        by_type=total_by_type(c.by_type for c in counters),
    )


def summarize_load(
    requests: Sequence[RequestRecord],
    counters: Sequence[CountersRecord],
    passes: Sequence[PassRecord],
    plain_tok_s: float | None,
) -> LoadSummaryRecord | None:
    """The row of ONE configuration at ONE concurrency, from its own records.

    Aggregate tok/s: per pass, tokens / wall; median and min-max over passes. Speedup: that median
    over plain's (``plain_tok_s``, same concurrency; plain's own row uses its own). Identity: per
    prompt, every request of every client and pass against plain's for the same (prompt, rep, client).
    """
    if not requests:
        return None
    first = requests[0]
    tok_s = spread_of([p.tok_s for p in passes if p.tok_s is not None])
    baseline = tok_s.median if first.config == PLAIN else plain_tok_s
    return LoadSummaryRecord(
        config=first.config,
        concurrency=first.concurrency or 1,
        draft=first.draft,
        budget=first.budget,
        synthetic=first.synthetic,
        synth_len=first.synth_len,
        prompts=len({r.prompt_id for r in requests}),
        reps=len({r.rep for r in requests}),
        requests=len(requests),
        tokens=sum(r.n_predicted for r in requests),
        tok_s=tok_s,
        request_tok_s=spread_of([r.tok_s for r in requests if r.tok_s is not None]),
        ttft_ms=quantiles_of([r.ttft_ms for r in requests if r.ttft_ms is not None]),
        latency_ms=quantiles_of([r.request_ms for r in requests]),
        speedup=speedup(tok_s.median, baseline),
        drafting=_drafting(requests, counters) if first.config != PLAIN else None,
    )


def summarize(records: Iterable[Mapping[str, Any]], upstream: Mapping[str, float] | None = None) -> list[Summary]:
    """The summary rows a run wrote, rebuilt from its request, counters and pass records (others are
    ignored): ``SummaryRecord`` per configuration × category (and ``all``), or for a --concurrency run
    ``LoadSummaryRecord`` per concurrency × configuration (``to_record()``: the lines as written, without
    the measured run's load time)."""
    records = list(records)
    requests, counters = measured(records)
    passes = [PassRecord.from_record(r) for r in records if r.get("record") == "pass"]
    rows: list[Summary] = []
    single = [r for r in requests if r.concurrency is None]
    configs = list(dict.fromkeys(r.config for r in single))
    categories = list(dict.fromkeys(r.category for r in single))
    plain_median: dict[str, float | None] = {}
    for config in configs:
        summary = summarize_config(
            [r for r in single if r.config == config],
            [c for c in counters if c.config == config and c.concurrency is None],
            categories,
            plain_median,
            upstream,
        )
        if config == PLAIN:
            plain_median = medians(summary)
        rows += summary
    plain_tok_s: dict[int, float | None] = {}
    for conc, config in dict.fromkeys((r.concurrency, r.config) for r in requests if r.concurrency is not None):
        row = summarize_load(
            [r for r in requests if (r.concurrency, r.config) == (conc, config)],
            [c for c in counters if (c.concurrency, c.config) == (conc, config)],
            [p for p in passes if (p.concurrency, p.config) == (conc, config)],
            plain_tok_s.get(conc),
        )
        if row is not None:
            if config == PLAIN:
                plain_tok_s[conc] = row.tok_s.median
            rows.append(row)
    return rows
