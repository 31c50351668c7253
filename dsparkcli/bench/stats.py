"""Pure statistics of a bench: spreads, speedups, token identity and the summary rows.

The same records always give the same table: ``summarize`` rebuilds from a JSONL file exactly the
summary rows a run wrote, one configuration at a time from that configuration's own records.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dsparkcli.bench.records import (
    ALL,
    PLAIN,
    CountersRecord,
    Divergence,
    DraftSummary,
    RequestRecord,
    Spread,
    SummaryRecord,
    measured,
)
from dsparkcli.llama.protocol import SpecCounters


def spread(values: Sequence[float], *, count: bool = False) -> dict[str, float | None]:
    """Median, min and max (and ``n`` with ``count``); None for an empty sequence."""
    s = spread_of(values).to_record()
    return {**s, "n": len(values)} if count else s


def spread_of(values: Sequence[float]) -> Spread:
    if not values:
        return Spread()
    return Spread(statistics.median(values), min(values), max(values))


def speedup(value: float | None, baseline: float | None) -> float | None:
    if value is None or not baseline:
        return None
    return value / baseline


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
            worst = min(reqs, key=lambda r: r.identity.first_divergence
                        if r.identity and r.identity.first_divergence is not None else never)
            divergent.append(Divergence(pid, min(firsts) if firsts else None, worst.output_sha256,
                                        worst.identity.plain_sha256 if worst.identity else None))
    return len(by_prompt), tuple(divergent)


def summarize_config(requests: Sequence[RequestRecord], counters: Sequence[CountersRecord],
                     categories: Sequence[str], plain_median: Mapping[str, float | None],
                     upstream: Mapping[str, float] | None = None) -> list[SummaryRecord]:
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
            total = SpecCounters.total(c.counters for c in counters if category == ALL or c.category == category)
            n_prompts, divergent = _divergences(reqs)
            drafting = DraftSummary(counters=total, timings_drafted=sum(r.draft_n for r in reqs),
                                    timings_accepted=sum(r.draft_n_accepted for r in reqs),
                                    identical=n_prompts - len(divergent), prompts=n_prompts, divergent=divergent)
        rows.append(SummaryRecord(
            config=first.config, category=category, draft=first.draft, budget=first.budget,
            synthetic=first.synthetic, synth_len=first.synth_len, prompts=len({r.prompt_id for r in reqs}),
            reps=len({r.rep for r in reqs}), requests=len(reqs), tokens=sum(r.n_predicted for r in reqs),
            tok_s=tok_s, speedup=speedup(tok_s.median, baseline),
            upstream_acceptance_length=upstream.get(category) if category != ALL else None, drafting=drafting,
        ))
    return rows


def medians(rows: Iterable[SummaryRecord]) -> dict[str, float | None]:
    """category -> median tok/s: the baseline later configurations' speedups divide by."""
    return {r.category: r.tok_s.median for r in rows}


def summarize(records: Iterable[Mapping[str, Any]], upstream: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """Summary rows per configuration × category (and ``all``) from request and counters records
    (any others are ignored), as the JSON objects a run writes."""
    requests, counters = measured(list(records))
    configs = list(dict.fromkeys(r.config for r in requests))
    categories = list(dict.fromkeys(r.category for r in requests))
    plain_median: dict[str, float | None] = {}
    rows: list[dict[str, Any]] = []
    for config in configs:
        summary = summarize_config([r for r in requests if r.config == config],
                                   [c for c in counters if c.config == config], categories, plain_median, upstream)
        if config == PLAIN:
            plain_median = medians(summary)
        rows += [s.to_record() for s in summary]
    return rows
