"""llama.cpp's wire protocol, written once: /metrics names and counters, chat messages, request bodies,
image data URLs and server-sent events.

Pure (no I/O, no HTTP): the server client, run, bench, selftest and the scripts all read and write
llama-server's protocol through this module, so a renamed counter or field is changed in one place.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsparkcli.errors import UsageError

DEFAULT_BUDGET = 5  # --spec-draft-n-max when neither the user nor the registry pair gives one

# Counters llama-server exposes at /metrics with --metrics (llamacpp_dspark.md §2.2)
M_DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
M_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
M_STEPS = "llamacpp:spec_decode_num_drafts_total"  # verification steps
M_PER_POS = 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="'  # + i + '"}'
# dspark's patch series (llama.patches): steps per draft length chosen by --spec-draft-n-max auto
M_BUDGET_CHOSEN = 'llamacpp:spec_decode_budget_chosen_total{k="'  # + k + '"}'

# A request's own draft settings (dspark's patch series; stock llama.cpp ignores them): the budget
# (an int, at most the server's --spec-draft-n-max, or AUTO with a --spec-cost-table), n_min and p_min.
SPEC_N_MAX = "speculative.n_max"
SPEC_N_MIN = "speculative.n_min"
SPEC_P_MIN = "speculative.p_min"
AUTO = "auto"  # --spec-draft-n-max auto; speculative.n_max = "auto"
SPEC_N_MAX_AUTO = "speculative.n_max_auto"  # generation_settings: the budget is chosen per step
SPEC_TYPES = "speculative.types"
# An empty request (nothing evaluated, answered at once) whose generation_settings are the server's own: the
# patched llama-server reports its --spec-draft-n-max nowhere else (/props shows the defaults of an empty
# configuration, /slots the last request's settings). A request's own n_max above it is capped silently
# (patch 0001) and echoed as sent, so a client that wants to know must ask first.
SETTINGS_PROBE = {"prompt": "", "n_predict": 0}

# /completion fields bench keeps (llama-server otherwise returns the whole generation state)
COMPLETION_FIELDS = ["content", "tokens", "timings", "stop_type", "tokens_evaluated", "truncated"]

SSE_DONE = "[DONE]"


# ------------------------------------------------------------------ /metrics


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name or name{labels}: value}; comments skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            values[name.strip()] = float(value)
        except ValueError:
            continue
    return values


def mean_acceptance_length(accepted: float, steps: float) -> float | None:
    """Mean acceptance length, llama.cpp's definition (its "draft acceptance" log line and
    ``common/speculative.cpp``): tokens per verification step, 1 + accepted / steps. None without steps."""
    return 1.0 + accepted / steps if steps else None


@dataclass(frozen=True)
class SpecCounters:
    """The speculative-decoding counters of one /metrics scrape, or the difference of two."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification steps
    accepted_per_pos: tuple[int, ...] = ()  # accepted drafts at block position i

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float] | str) -> SpecCounters:
        """From parsed /metrics (or its text); missing counters read as 0."""
        values = parse_metrics(metrics) if isinstance(metrics, str) else metrics
        per_pos: dict[int, int] = {}
        for key, value in values.items():
            if key.startswith(M_PER_POS):
                per_pos[int(key[len(M_PER_POS) :].split('"', 1)[0])] = int(value)
        width = max(per_pos) + 1 if per_pos else 0
        return cls(
            drafted=int(values.get(M_DRAFTED, 0)),
            accepted=int(values.get(M_ACCEPTED, 0)),
            steps=int(values.get(M_STEPS, 0)),
            accepted_per_pos=tuple(per_pos.get(i, 0) for i in range(width)),
        )

    def minus(self, before: SpecCounters) -> SpecCounters:
        """What moved between ``before`` and this scrape (the per-position list grows when first used)."""
        width = max(len(before.accepted_per_pos), len(self.accepted_per_pos))
        after_pp, before_pp = _pad(self.accepted_per_pos, width), _pad(before.accepted_per_pos, width)
        return SpecCounters(
            drafted=self.drafted - before.drafted,
            accepted=self.accepted - before.accepted,
            steps=self.steps - before.steps,
            accepted_per_pos=tuple(a - b for a, b in zip(after_pp, before_pp)),
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        return SpecCounters(
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            steps=self.steps + other.steps,
            accepted_per_pos=tuple(
                a + b for a, b in zip(_pad(self.accepted_per_pos, width), _pad(other.accepted_per_pos, width))
            ),
        )

    @staticmethod
    def total(items: Iterable[SpecCounters]) -> SpecCounters:
        out = SpecCounters()
        for c in items:
            out = out.plus(c)
        return out

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_length(self) -> float | None:
        return mean_acceptance_length(self.accepted, self.steps)

    def to_record(self) -> dict[str, Any]:
        """The JSONL/--json form: plain ints and a list."""
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "steps": self.steps,
            "accepted_per_pos": list(self.accepted_per_pos),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> SpecCounters:
        return cls(
            drafted=int(rec["drafted"]),
            accepted=int(rec["accepted"]),
            steps=int(rec["steps"]),
            accepted_per_pos=tuple(int(x) for x in rec.get("accepted_per_pos") or ()),
        )


def _pad(xs: Sequence[int], width: int) -> tuple[int, ...]:
    return tuple(xs) + (0,) * (width - len(xs))


# ------------------------------------------------------------------ which type of a chain proposed

# /metrics and a response's timings count every type together; the pinned engine says which type proposed
# only in common_speculative_print_stats' line, one per type at each request's end at -lv 4 (trace level),
# cumulative since the server started:
#   spec common_specu: statistics        ngram-mod: #calls(b,g,a) =    1     29      2, #gen drafts =      2,
#   #acc drafts =     2, #gen tokens =     85, #acc tokens =     9, #mean acc len = ...
# #calls a is the verification steps of the type's drafts (common_speculative_accept counts it for the type
# whose draft was verified): over the types, steps, gen tokens and acc tokens sum to /metrics' counters.
_TYPE_STATS = re.compile(
    r"statistics\s+(?P<type>[a-z0-9-]+): #calls\(b,g,a\) =\s*\d+\s+\d+\s+(?P<steps>\d+), "
    r"#gen drafts =\s*(?P<drafts>\d+), #acc drafts =\s*\d+, "
    r"#gen tokens =\s*(?P<drafted>\d+), #acc tokens =\s*(?P<accepted>\d+)"
)


@dataclass(frozen=True)
class TypeCounters:
    """One speculation type's counters (llama.cpp's name: ngram-mod, draft-dspark), cumulative as read from
    a log, or the difference of two reads."""

    type: str
    steps: int = 0  # verification steps of this type's drafts
    drafts: int = 0  # drafts it proposed
    drafted: int = 0  # tokens in them
    accepted: int = 0

    def minus(self, before: TypeCounters) -> TypeCounters:
        return TypeCounters(
            self.type,
            self.steps - before.steps,
            self.drafts - before.drafts,
            self.drafted - before.drafted,
            self.accepted - before.accepted,
        )

    def plus(self, other: TypeCounters) -> TypeCounters:
        return TypeCounters(
            self.type,
            self.steps + other.steps,
            self.drafts + other.drafts,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "steps": self.steps,
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TypeCounters:
        return cls(rec["type"], int(rec["steps"]), int(rec["drafts"]), int(rec["drafted"]), int(rec["accepted"]))


@dataclass(frozen=True)
class TypeStats:
    """What a log says per type: the latest cumulative counters, and how many statistics lines it has (one
    per finished request: the reader waits for a block's lines, the log is written by a thread)."""

    counters: tuple[TypeCounters, ...] = ()  # in the server's order (llama.cpp's trial order)
    lines: int = 0  # statistics lines of the first type

    def minus(self, before: TypeStats) -> tuple[TypeCounters, ...]:
        """Each type's counters between ``before`` and this read."""
        old = {c.type: c for c in before.counters}
        return tuple(c.minus(old.get(c.type, TypeCounters(c.type))) for c in self.counters)


def type_stats(log_text: str) -> TypeStats:
    """The per-type statistics lines of a llama-server log (at -lv 4): each type's latest counters."""
    latest: dict[str, TypeCounters] = {}
    first: str | None = None
    lines = 0
    for m in _TYPE_STATS.finditer(log_text):
        name = m["type"]
        first = first or name
        lines += name == first
        latest[name] = TypeCounters(name, int(m["steps"]), int(m["drafts"]), int(m["drafted"]), int(m["accepted"]))
    return TypeStats(tuple(latest.values()), lines)


def total_by_type(blocks: Iterable[Sequence[TypeCounters]]) -> tuple[TypeCounters, ...]:
    """Several blocks' per-type counters summed, per type in the order first seen."""
    out: dict[str, TypeCounters] = {}
    for block in blocks:
        for c in block:
            out[c.type] = out[c.type].plus(c) if c.type in out else c
    return tuple(out.values())


def timings_drafts(timings: Mapping[str, Any]) -> tuple[int, int]:
    """(draft_n, draft_n_accepted) of a response's ``timings``; both are absent when nothing was drafted."""
    return int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))


@dataclass(frozen=True)
class BudgetTimings:
    """What a response's ``timings`` say about its adaptive budget (absent: not adaptive)."""

    steps: int = 0  # steps whose draft length was chosen
    total: int = 0  # the chosen lengths' sum
    zero: int = 0  # steps that chose no draft

    @property
    def mean(self) -> float | None:
        return self.total / self.steps if self.steps else None

    @classmethod
    def from_timings(cls, timings: Mapping[str, Any]) -> BudgetTimings:
        return cls(
            int(timings.get("draft_budget_steps", 0)),
            int(timings.get("draft_budget_sum", 0)),
            int(timings.get("draft_budget_zero", 0)),
        )


def budget_chosen(metrics: Mapping[str, float] | str) -> dict[int, int]:
    """/metrics' steps per chosen draft length {k: steps} (empty: no adaptive step yet, or stock)."""
    values = parse_metrics(metrics) if isinstance(metrics, str) else metrics
    return {
        int(key[len(M_BUDGET_CHOSEN) :].split('"', 1)[0]): int(v)
        for key, v in values.items()
        if key.startswith(M_BUDGET_CHOSEN)
    }


@dataclass(frozen=True)
class ServedBudget:
    """A server's own draft budget: at most ``n_max`` drafts a step, chosen per step when ``auto``."""

    n_max: int
    auto: bool = False

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ServedBudget | None:
        """From ``generation_settings`` of a request that set no draft field; None: the server has no draft
        (or is a stock llama-server, which reports no budget)."""
        if SPEC_N_MAX not in settings or "draft" not in str(settings.get(SPEC_TYPES, "draft")):
            return None
        return cls(int(settings[SPEC_N_MAX]), bool(settings.get(SPEC_N_MAX_AUTO)))


def draft_settings(
    n_max: int | str | None = None, n_min: int | None = None, p_min: float | None = None
) -> dict[str, Any]:
    """A request's own draft fields (None leaves one at the server's value); ``n_max`` an int >= 0 or AUTO."""
    out: dict[str, Any] = {}
    if n_max is not None:
        if n_max != AUTO and not (isinstance(n_max, int) and not isinstance(n_max, bool) and n_max >= 0):
            raise UsageError(f"a request's draft budget must be an integer >= 0 or {AUTO!r}, got {n_max!r}")
        out[SPEC_N_MAX] = n_max
    if n_min is not None:
        if n_min < 0:
            raise UsageError(f"a request's n_min must be >= 0, got {n_min}")
        out[SPEC_N_MIN] = int(n_min)
    if p_min is not None:
        if not 0.0 <= p_min <= 1.0:
            raise UsageError(f"a request's p_min must be within [0, 1], got {p_min}")
        out[SPEC_P_MIN] = float(p_min)
    return out


# ------------------------------------------------------------------ requests


def image_base64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def image_data_url(mime: str, raw: bytes) -> str:
    """The one data-URL builder for images in chat messages."""
    return f"data:{mime};base64,{image_base64(raw)}"


def build_messages(prompt: str, image_urls: Sequence[str] = (), system: str | None = None) -> list[dict[str, Any]]:
    """OpenAI chat messages (images as data URLs); the text always follows the last image (llama.cpp
    asserts otherwise). The one place that lays out a request, for run, serve clients, bench and selftest."""
    if not prompt.strip():
        raise UsageError("the prompt is empty")
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    if image_urls:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
        content.append({"type": "text", "text": prompt})
        messages.append({"role": "user", "content": content})
    else:
        messages.append({"role": "user", "content": prompt})
    return messages


def chat_payload(
    messages: list[dict[str, Any]],
    *,
    max_tokens: int,
    temp: float,
    seed: int | None,
    ignore_eos: bool = False,
    stream: bool = True,
    draft: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A /v1/chat/completions body. ``draft``: the request's own draft settings (``draft_settings``)."""
    payload: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": temp, "stream": stream}
    payload.update(draft or {})
    if seed is not None:
        payload["seed"] = seed
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


def completion_payload(
    prompt: Any,
    *,
    n_predict: int,
    seed: int | None = None,
    ignore_eos: bool | None = None,
    return_tokens: bool | None = True,
    cache_prompt: bool = False,
    response_fields: Sequence[str] | None = None,
    draft: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A greedy /completion body. ``prompt``: token ids, a string, or {prompt_string, multimodal_data}.
    ``None`` leaves a field out (llama-server's default). ``draft``: the request's own draft settings."""
    payload: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, **(draft or {})}
    optional = {"seed": seed, "return_tokens": return_tokens, "ignore_eos": ignore_eos}
    payload.update({k: v for k, v in optional.items() if v is not None})
    payload["cache_prompt"] = cache_prompt
    if response_fields is not None:
        payload["response_fields"] = list(response_fields)
    return payload


# ------------------------------------------------------------------ server-sent events


def sse_data(line: str) -> str | None:
    """The payload of one SSE ``data:`` line (``[DONE]`` included); None for any other line."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def chunk_text(chunk: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """(content pieces, finish reason) of one streamed chat chunk."""
    pieces: list[str] = []
    finish: str | None = None
    for choice in chunk.get("choices", []):
        delta = choice.get("delta", {}).get("content")
        if delta:
            pieces.append(delta)
        if choice.get("finish_reason"):
            finish = choice["finish_reason"]
    return pieces, finish
