"""`dspark tune`'s model, pure: the measured cost of a round, the workload's per-position acceptance, the
predicted speedup of every (budget k, p_min), the pick, and the tuning record that `--budget auto` reads.

The model is BENCHMARKS.md's ("Bound vs measured speedup", within a few per cent on the H200 grid):
a verification step with k drafts costs t_step(k) when nothing is accepted (measured in all-rejected
``--spec-synth-len 1`` cells) plus s for every accepted token, and yields τ tokens, so

    speedup(k) = τ(k)·t1 / (t_step(k) + (τ(k) − 1)·s)          t1: plain ms per token

τ(k) comes from /metrics at the largest candidate budget: a DSpark block's first k slots are the same
whatever the budget, so the drafts accepted at positions < k are the accepted tokens a budget-k step
would have had: τ(k) = 1 + Σ_{i<k} accepted_per_pos[i] / steps. A confidence threshold (p_min) cuts blocks
and skips some rounds entirely (a plain decode, cost t1); both are read from the same counters.

Standard library only (scripts on a GPU machine import it with nothing else installed).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsparkcli.llama import budget
from dsparkcli.llama.protocol import SpecCounters

RECORD_KIND = "dspark-tuning"
RECORD_VERSION = 1
OVERALL = "all"  # the pooled workload: --budget auto without --category

# llama-server flags that change what a token or a step costs: part of the tuning key (value as given).
COST_FLAGS: dict[str, str] = {
    "-ngl": "ngl", "--gpu-layers": "ngl", "--n-gpu-layers": "ngl",
    "-ngld": "ngld", "--gpu-layers-draft": "ngld", "--n-gpu-layers-draft": "ngld",
    "-fa": "fa", "--flash-attn": "fa",
    "-c": "ctx", "--ctx-size": "ctx",
    "-ctk": "ctk", "--cache-type-k": "ctk", "-ctv": "ctv", "--cache-type-v": "ctv",
    "-ctkd": "ctkd", "--cache-type-k-draft": "ctkd", "-ctvd": "ctvd", "--cache-type-v-draft": "ctvd",
    "-np": "np", "--parallel": "np",
    "-t": "threads", "--threads": "threads", "-td": "threads_draft", "--threads-draft": "threads_draft",
}


def cost_flags(argv: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The cost-changing flags of a llama-server argv, canonical names, sorted; the last value wins."""
    found: dict[str, str] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in COST_FLAGS:
            if eq:
                found[COST_FLAGS[name]] = value
            elif i + 1 < len(args):
                found[COST_FLAGS[name]] = args[i + 1]
    return tuple(sorted(found.items()))


def synth_rates(length: float, n_max: int) -> tuple[float, ...]:
    """llama.cpp's ``--spec-synth-len L`` at ``--spec-draft-n-max n_max`` as unconditional per-position
    rates (common_speculative_synth_rates_resolve: geometric p^(i+1), p bisected so 1 + Σ rates = L).
    Their first k, passed as ``--spec-synth-rates``, emulate the same draft at budget k."""
    if n_max < 1 or not 1.0 <= length <= n_max + 1:
        raise ValueError(f"synthetic acceptance length must be within [1, {n_max + 1}] (got {length})")
    if length == n_max + 1:
        p = 1.0
    elif length > 1.0:
        lo, hi = 0.0, 1.0
        for _ in range(32):
            mid = 0.5 * (lo + hi)
            total, term = 0.0, mid
            for _ in range(n_max):
                total += term
                term *= mid
            lo, hi = (mid, hi) if total < length - 1.0 else (lo, mid)
        p = 0.5 * (lo + hi)
    else:
        p = 0.0
    return tuple(p ** (i + 1) for i in range(n_max))


# ------------------------------------------------------------------ the tuning key


@dataclass(frozen=True)
class TuningKey:
    """What a tuning is valid for: the exact files, engine build, machine and cost-changing flags."""

    target_sha256: str
    draft_sha256: str
    engine_commit: str
    backend: str
    gpu: str
    flags: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """A short stable name (the record's file name)."""
        text = json.dumps(self.to_record(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_record(self) -> dict[str, Any]:
        return {"target_sha256": self.target_sha256, "draft_sha256": self.draft_sha256,
                "engine_commit": self.engine_commit, "backend": self.backend, "gpu": self.gpu,
                "flags": {k: v for k, v in self.flags}}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TuningKey:
        return cls(target_sha256=str(rec["target_sha256"]), draft_sha256=str(rec["draft_sha256"]),
                   engine_commit=str(rec["engine_commit"]), backend=str(rec["backend"]), gpu=str(rec["gpu"]),
                   flags=tuple(sorted((str(k), str(v)) for k, v in (rec.get("flags") or {}).items())))

    def differences(self, other: TuningKey) -> list[str]:
        """Human names of the fields where ``other`` differs (for "no tuning matches" messages)."""
        out = [name for name, a, b in (("target", self.target_sha256, other.target_sha256),
                                       ("draft", self.draft_sha256, other.draft_sha256),
                                       ("engine commit", self.engine_commit, other.engine_commit),
                                       ("backend", self.backend, other.backend), ("GPU", self.gpu, other.gpu))
               if a != b]
        mine, theirs = dict(self.flags), dict(other.flags)
        for flag in sorted(set(mine) | set(theirs)):
            if mine.get(flag) != theirs.get(flag):
                out.append(f"{flag} {theirs.get(flag, 'default')} (here {mine.get(flag, 'default')})")
        return out


# ------------------------------------------------------------------ the cost model


@dataclass(frozen=True)
class CostModel:
    """Measured on this machine and engine, never assumed (milliseconds)."""

    t1_ms: float  # plain decoding, per token
    t_step_ms: tuple[tuple[int, float], ...]  # (k, step with k drafts and nothing accepted), sorted by k
    s_ms: float = 0.0  # what each accepted token adds to a step

    def step(self, drafted: float) -> float:
        """t_step at a (mean) number of drafts: linear between measured budgets, clamped outside them."""
        pts = sorted(self.t_step_ms)
        if not pts:
            raise ValueError("the cost model has no step costs")
        if drafted <= pts[0][0]:
            return pts[0][1]
        for (k0, c0), (k1, c1) in zip(pts, pts[1:]):
            if drafted <= k1:
                return c0 + (c1 - c0) * (drafted - k0) / (k1 - k0)
        return pts[-1][1]

    def break_even(self, k: int) -> float:
        """Mean tokens per step at which budget k only matches plain decoding: τ·t1 = t_step + (τ−1)·s."""
        return (self.step(k) - self.s_ms) / (self.t1_ms - self.s_ms) if self.t1_ms > self.s_ms else math.inf

    def to_record(self) -> dict[str, Any]:
        return {"t1_ms": self.t1_ms, "t_step_ms": {str(k): v for k, v in self.t_step_ms}, "s_ms": self.s_ms}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> CostModel:
        steps = tuple(sorted((int(k), float(v)) for k, v in (rec.get("t_step_ms") or {}).items()))
        return cls(t1_ms=float(rec["t1_ms"]), t_step_ms=steps, s_ms=float(rec.get("s_ms", 0.0)))


def cost_table(cost: CostModel) -> str:
    """The per-k step-cost table for llama.cpp's adaptive budget (``--spec-cost-table FILE``, the format
    of ``llama.budget``): k = 0 is plain decoding (t1), s is given once."""
    return budget.format_cost_table({0: cost.t1_ms, **dict(cost.t_step_ms)}, cost.s_ms,
                                    comment="dspark tune cost table")


def budget_table(cost: CostModel) -> budget.CostTable:
    """The table the engine reads from ``cost_table(cost)`` (parsed back, so the doubles are its own)."""
    return budget.parse_cost_table(cost_table(cost))


# ------------------------------------------------------------------ acceptance


@dataclass(frozen=True)
class Acceptance:
    """One workload (category) at the largest candidate budget and one p_min: /metrics deltas plus the
    tokens generated, which together say how many rounds were verification steps."""

    category: str
    budget: int
    p_min: float
    counters: SpecCounters
    tokens: int  # tokens generated over the requests (each request's first comes from the prompt)
    requests: int

    @property
    def plain_rounds(self) -> int:
        """Rounds without a draft (p_min cut the whole block, or the request's last token)."""
        c = self.counters
        return max(0, self.tokens - self.requests - c.steps - c.accepted)

    @property
    def step_fraction(self) -> float:
        """q: the share of rounds that were verification steps."""
        rounds = self.counters.steps + self.plain_rounds
        return self.counters.steps / rounds if rounds else 0.0

    def accepted_per_step(self, k: int) -> float:
        c = self.counters
        return sum(c.accepted_per_pos[:k]) / c.steps if c.steps else 0.0

    def tokens_per_step(self, k: int) -> float:
        return 1.0 + self.accepted_per_step(k)

    def drafted_per_step(self, k: int) -> float:
        c = self.counters
        return min(float(k), c.drafted / c.steps) if c.steps else float(k)

    def rates(self) -> list[float]:
        """Conditional acceptance per position: P(slot i accepted | slot i−1 accepted)."""
        c, out, prev = self.counters, [], self.counters.steps
        for n in c.accepted_per_pos:
            out.append(n / prev if prev else 0.0)
            prev = n
        return out

    def to_record(self) -> dict[str, Any]:
        return {"category": self.category, "budget": self.budget, "p_min": self.p_min,
                "counters": self.counters.to_record(), "tokens": self.tokens, "requests": self.requests,
                "mean_length": self.counters.mean_length, "rates": self.rates()}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Acceptance:
        return cls(category=str(rec["category"]), budget=int(rec["budget"]), p_min=float(rec["p_min"]),
                   counters=SpecCounters.from_record(rec["counters"]), tokens=int(rec["tokens"]),
                   requests=int(rec["requests"]))


def pooled(items: Iterable[Acceptance], category: str = OVERALL) -> Acceptance:
    """Several categories as one workload (same budget and p_min)."""
    items = list(items)
    return Acceptance(category=category, budget=items[0].budget, p_min=items[0].p_min,
                      counters=SpecCounters.total(a.counters for a in items),
                      tokens=sum(a.tokens for a in items), requests=sum(a.requests for a in items))


# ------------------------------------------------------------------ prediction and choice


def _round(cost: CostModel, acc: Acceptance, k: int) -> tuple[float, float, float]:
    """(tokens per round, ms per round, tokens per step) at budget k for this workload."""
    q, tau = acc.step_fraction, acc.tokens_per_step(k)
    ms = q * (cost.step(acc.drafted_per_step(k)) + (tau - 1.0) * cost.s_ms) + (1.0 - q) * cost.t1_ms
    return q * tau + (1.0 - q), ms, tau


def predict_speedup(cost: CostModel, acc: Acceptance, k: int) -> float:
    """Predicted tok/s of budget k (at acc's p_min) over plain decoding's."""
    if k > acc.budget:
        raise ValueError(f"acceptance was measured at budget {acc.budget}; cannot predict budget {k}")
    tokens, ms, _ = _round(cost, acc, k)
    return tokens * cost.t1_ms / ms if ms > 0 else 0.0


def fit_s(cost: CostModel, cells: Iterable[tuple[Acceptance, float]]) -> float:
    """s by least squares over measured cells (acceptance, ms per token at its budget), as BENCHMARKS.md
    fitted it: ms/token × tokens/round = q·t_step + (1−q)·t1 + q·(τ−1)·s. Never negative."""
    sxy = sxx = 0.0
    for acc, ms_per_token in cells:
        q, k = acc.step_fraction, acc.budget
        tau = acc.tokens_per_step(k)
        x = q * (tau - 1.0)
        y = ms_per_token * (q * tau + 1.0 - q) - q * cost.step(acc.drafted_per_step(k)) - (1.0 - q) * cost.t1_ms
        sxy, sxx = sxy + x * y, sxx + x * x
    return max(0.0, sxy / sxx) if sxx > 0 else 0.0


@dataclass(frozen=True)
class Candidate:
    budget: int
    p_min: float

    @property
    def label(self) -> str:
        return f"k={self.budget}" + (f",p={self.p_min:g}" if self.p_min else "")


@dataclass(frozen=True)
class Prediction:
    category: str
    candidate: Candidate
    speedup: float
    tokens_per_step: float


def predict_all(cost: CostModel, acceptance: Iterable[Acceptance], budgets: Sequence[int]) -> list[Prediction]:
    """Every (k, p_min) for every measured workload (one Acceptance per category × p_min)."""
    out = []
    for acc in acceptance:
        for k in sorted(b for b in budgets if b <= acc.budget):
            out.append(Prediction(acc.category, Candidate(k, acc.p_min), predict_speedup(cost, acc, k),
                                  acc.tokens_per_step(k)))
    return out


def ranked(predictions: Iterable[Prediction], category: str) -> list[Prediction]:
    """Best first; ties go to the smaller budget, then the lower p_min (cheaper, fewer surprises)."""
    mine = [p for p in predictions if p.category == category]
    return sorted(mine, key=lambda p: (-p.speedup, p.candidate.budget, p.candidate.p_min))


def shortlist(predictions: Sequence[Prediction], categories: Sequence[str], top: int) -> list[Candidate]:
    """The candidates worth measuring: each category's ``top`` best by prediction, in first-seen order."""
    picked: list[Candidate] = []
    for cat in categories:
        for p in ranked(predictions, cat)[:top]:
            if p.candidate not in picked:
                picked.append(p.candidate)
    return picked


@dataclass(frozen=True)
class Choice:
    """What --budget auto uses for one category: a candidate, or None = plain decoding pays best."""

    category: str
    candidate: Candidate | None
    predicted: float | None  # predicted speedup of the candidate
    measured: float | None  # measured speedup over plain in the verification run (None: not verified)

    def to_record(self) -> dict[str, Any]:
        c = self.candidate
        return {"category": self.category, "budget": c.budget if c else None, "p_min": c.p_min if c else None,
                "plain": c is None, "predicted": self.predicted, "measured": self.measured}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Choice:
        c = None if rec.get("plain") else Candidate(int(rec["budget"]), float(rec.get("p_min") or 0.0))
        return cls(category=str(rec["category"]), candidate=c, predicted=rec.get("predicted"),
                   measured=rec.get("measured"))


def choose(predictions: Sequence[Prediction], category: str,
           measured: Mapping[Candidate, float] | None = None) -> Choice:
    """The pick for one category. With measured speedups (the verification run, plain = 1.0 in the same
    run) the best measured candidate wins; otherwise the best prediction. Plain when nothing beats 1.0."""
    preds = {p.candidate: p.speedup for p in predictions if p.category == category}
    if measured:
        best = min(measured.items(), key=lambda kv: (-kv[1], kv[0].budget, kv[0].p_min))
        if best[1] <= 1.0:
            return Choice(category, None, None, 1.0)
        return Choice(category, best[0], preds.get(best[0]), best[1])
    order = ranked(predictions, category)
    if not order or order[0].speedup <= 1.0:
        return Choice(category, None, None, None)
    return Choice(category, order[0].candidate, order[0].speedup, None)


# ------------------------------------------------------------------ the record


@dataclass(frozen=True)
class TuningRecord:
    """One tune's result, as stored (JSON) and read back by --budget auto."""

    key: TuningKey
    cost: CostModel
    acceptance: tuple[Acceptance, ...]
    predictions: tuple[Prediction, ...]
    choices: tuple[Choice, ...]
    verified: tuple[tuple[str, str, float], ...] = ()  # (category, candidate label, measured speedup)
    budgets: tuple[int, ...] = ()
    p_mins: tuple[float, ...] = (0.0,)
    synthetic: bool = False
    synth_len: float | None = None
    timings_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    created: str = ""
    run_id: str = ""
    jsonl: str = ""  # the bench records the figures come from
    complete: bool = True  # False: interrupted; what was measured is kept, no choice is made from it

    def choice(self, category: str | None = None) -> Choice | None:
        wanted = category or OVERALL
        return next((c for c in self.choices if c.category == wanted), None)

    @property
    def categories(self) -> list[str]:
        return [c.category for c in self.choices]

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": RECORD_KIND, "version": RECORD_VERSION, "key": self.key.to_record(), "key_id": self.key.id,
            "created": self.created, "run_id": self.run_id, "jsonl": self.jsonl, "complete": self.complete,
            "synthetic": self.synthetic, "synth_len": self.synth_len, "budgets": list(self.budgets),
            "p_mins": list(self.p_mins), "cost": self.cost.to_record(),
            "acceptance": [a.to_record() for a in self.acceptance],
            "predictions": [{"category": p.category, "budget": p.candidate.budget, "p_min": p.candidate.p_min,
                             "speedup": p.speedup, "tokens_per_step": p.tokens_per_step} for p in self.predictions],
            "verified": [{"category": c, "candidate": lb, "speedup": s} for c, lb, s in self.verified],
            "choices": [c.to_record() for c in self.choices], "timings_s": dict(self.timings_s),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TuningRecord:
        if rec.get("kind") != RECORD_KIND or rec.get("version") != RECORD_VERSION:
            raise ValueError(f"not a dspark tuning record (version {RECORD_VERSION})")
        return cls(
            key=TuningKey.from_record(rec["key"]), cost=CostModel.from_record(rec["cost"]),
            acceptance=tuple(Acceptance.from_record(a) for a in rec.get("acceptance") or ()),
            predictions=tuple(Prediction(p["category"], Candidate(int(p["budget"]), float(p["p_min"])),
                                         float(p["speedup"]), float(p["tokens_per_step"]))
                              for p in rec.get("predictions") or ()),
            choices=tuple(Choice.from_record(c) for c in rec.get("choices") or ()),
            verified=tuple((v["category"], v["candidate"], float(v["speedup"])) for v in rec.get("verified") or ()),
            budgets=tuple(int(b) for b in rec.get("budgets") or ()),
            p_mins=tuple(float(p) for p in rec.get("p_mins") or (0.0,)), synthetic=bool(rec.get("synthetic")),
            synth_len=rec.get("synth_len"), timings_s=dict(rec.get("timings_s") or {}),
            created=str(rec.get("created", "")), run_id=str(rec.get("run_id", "")), jsonl=str(rec.get("jsonl", "")),
            complete=bool(rec.get("complete", True)),
        )
