"""The budget's cost model, pure: the measured cost of a round, the workload's per-position acceptance, the
predicted speedup of every (budget k, p_min), the fit of each cost term on the cells that measure it, the
pick, and how far a prediction landed from its measurement.

A verification step with k drafts costs t_step(k) when nothing is accepted (measured in all-rejected
``--spec-synth-len 1`` cells) plus s for every accepted token, and yields τ tokens, so at p_min 0

    speedup(k) = τ(k)·t1 / (t_step(k) + (τ(k) − 1)·s)          t1: plain ms per token

τ(k) comes from /metrics at the largest candidate budget: a DSpark block's first k slots are the same
whatever the budget, so the drafts accepted at positions < k are the accepted tokens a budget-k step
would have had: τ(k) = 1 + Σ_{i<k} accepted_per_pos[i] / steps. A confidence threshold (p_min) cuts blocks
and skips some rounds entirely (a plain decode, cost t1); both are read from the same counters.

The p_min path costs time of its own: with a threshold the engine reads the confidence head's output
back for every position of the block (common/speculative.cpp, ``llama_get_embeddings_nextn``), in every
round, the ones it then cuts to nothing included, and a DSpark block at budget k is k + 1 positions
(patch 0003). So ``p_min_ms`` holds, per threshold, ms per block position per round, fitted on that
threshold's cells only, after s is fitted on the cells without p_min. Fitted together, that time was
charged to accepted tokens and no budget looked worth drafting (the REAL smollm2-135m pair on the H200:
s 1.56 ms where its p 0 cells say 0.39 in issue 30's run; 0.50 against 0.32 in study/results/h200/real/tune).

Standard library only (scripts on a GPU machine import it with nothing else installed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsparkcli.budget import rule
from dsparkcli.llama.protocol import SpecCounters

OVERALL = "all"  # the pooled workload: --budget auto without --category
OFF_BY = 0.10  # a verified cell whose prediction misses its measurement by more than this: the model is off


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


# ------------------------------------------------------------------ the cost model


@dataclass(frozen=True)
class CostModel:
    """Measured on this machine and engine, never assumed (milliseconds)."""

    t1_ms: float  # plain decoding, per token
    t_step_ms: tuple[tuple[int, float], ...]  # (k, step with k drafts and nothing accepted), sorted by k
    s_ms: float = 0.0  # what each accepted token adds to a step (fitted on cells without p_min)
    # (p_min, ms a round costs on top per block position at that confidence threshold), fitted on its cells
    p_min_ms: tuple[tuple[float, float], ...] = ()

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

    def p_min_extra(self, p_min: float, k: int) -> float:
        """ms a round at budget k costs on top at this threshold: its block's k + 1 positions read back
        (0 at p 0, and at a threshold that was not measured)."""
        return dict(self.p_min_ms).get(p_min, 0.0) * (k + 1) if p_min else 0.0

    def break_even(self, k: int) -> float:
        """Mean tokens per step at which budget k only matches plain decoding: τ·t1 = t_step + (τ−1)·s."""
        return (self.step(k) - self.s_ms) / (self.t1_ms - self.s_ms) if self.t1_ms > self.s_ms else math.inf

    def to_record(self) -> dict[str, Any]:
        return {
            "t1_ms": self.t1_ms,
            "t_step_ms": {str(k): v for k, v in self.t_step_ms},
            "s_ms": self.s_ms,
            "p_min_ms": {f"{p:g}": v for p, v in self.p_min_ms},
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> CostModel:
        steps = tuple(sorted((int(k), float(v)) for k, v in (rec.get("t_step_ms") or {}).items()))
        extra = tuple(sorted((float(p), float(v)) for p, v in (rec.get("p_min_ms") or {}).items()))
        return cls(t1_ms=float(rec["t1_ms"]), t_step_ms=steps, s_ms=float(rec.get("s_ms", 0.0)), p_min_ms=extra)


def cost_table(cost: CostModel) -> str:
    """The per-k step-cost table for llama.cpp's adaptive budget (``--spec-cost-table FILE``, the format
    of ``budget.rule``): k = 0 is plain decoding (t1), s is given once (the adaptive budget drafts at p 0)."""
    return rule.format_cost_table({0: cost.t1_ms, **dict(cost.t_step_ms)}, cost.s_ms, comment="dspark tune cost table")


def budget_table(cost: CostModel) -> rule.CostTable:
    """The table the engine reads from ``cost_table(cost)`` (parsed back, so the doubles are its own)."""
    return rule.parse_cost_table(cost_table(cost))


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
        return {
            "category": self.category,
            "budget": self.budget,
            "p_min": self.p_min,
            "counters": self.counters.to_record(),
            "tokens": self.tokens,
            "requests": self.requests,
            "mean_length": self.counters.mean_length,
            "rates": self.rates(),
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Acceptance:
        return cls(
            category=str(rec["category"]),
            budget=int(rec["budget"]),
            p_min=float(rec["p_min"]),
            counters=SpecCounters.from_record(rec["counters"]),
            tokens=int(rec["tokens"]),
            requests=int(rec["requests"]),
        )


def pooled(items: Iterable[Acceptance], category: str = OVERALL) -> Acceptance:
    """Several categories as one workload (same budget and p_min)."""
    items = list(items)
    return Acceptance(
        category=category,
        budget=items[0].budget,
        p_min=items[0].p_min,
        counters=SpecCounters.total(a.counters for a in items),
        tokens=sum(a.tokens for a in items),
        requests=sum(a.requests for a in items),
    )


# ------------------------------------------------------------------ prediction and the fit


def _tokens_per_round(acc: Acceptance, k: int) -> float:
    q = acc.step_fraction
    return q * acc.tokens_per_step(k) + (1.0 - q)


def _round_ms(cost: CostModel, acc: Acceptance, k: int, *, s: bool = True, extra: bool = True) -> float:
    """ms per round at budget k: steps (t_step of the drafts + s per accepted token), plain rounds (t1),
    and the p_min path's own cost per round; ``s``/``extra`` False leave those terms out (the fit's base)."""
    q, tau = acc.step_fraction, acc.tokens_per_step(k)
    ms = q * (cost.step(acc.drafted_per_step(k)) + ((tau - 1.0) * cost.s_ms if s else 0.0)) + (1.0 - q) * cost.t1_ms
    return ms + (cost.p_min_extra(acc.p_min, k) if extra else 0.0)


def predict_speedup(cost: CostModel, acc: Acceptance, k: int) -> float:
    """Predicted tok/s of budget k (at acc's p_min) over plain decoding's."""
    if k > acc.budget:
        raise ValueError(f"acceptance was measured at budget {acc.budget}; cannot predict budget {k}")
    ms = _round_ms(cost, acc, k)
    return _tokens_per_round(acc, k) * cost.t1_ms / ms if ms > 0 else 0.0


Cell = tuple[Acceptance, float]  # a measured cell: its acceptance (at its own budget) and its ms per token


def fit_s(cost: CostModel, cells: Iterable[Cell]) -> float:
    """s by least squares over measured cells without p_min (BENCHMARKS.md's fit): ms/token × tokens/round
    = q·t_step + (1−q)·t1 + q·(τ−1)·s. Never negative. Cells with a p_min are left out: their own time
    (``fit_p_min``) would be charged to accepted tokens."""
    sxy = sxx = 0.0
    for acc, ms_per_token in cells:
        if acc.p_min:
            continue
        k = acc.budget
        x = acc.step_fraction * (acc.tokens_per_step(k) - 1.0)
        y = ms_per_token * _tokens_per_round(acc, k) - _round_ms(cost, acc, k, s=False, extra=False)
        sxy, sxx = sxy + x * y, sxx + x * x
    return max(0.0, sxy / sxx) if sxx > 0 else 0.0


def fit_p_min(cost: CostModel, cells: Iterable[Cell]) -> tuple[tuple[float, float], ...]:
    """Per threshold > 0, what a round costs beyond the model at p 0 (with ``cost``'s s), per block
    position: the mean over that threshold's cells of (ms/token × tokens/round − the model's ms per round)
    / (k + 1). Either sign: it is measured."""
    residuals: dict[float, list[float]] = {}
    for acc, ms_per_token in cells:
        if acc.p_min:
            k = acc.budget
            residuals.setdefault(acc.p_min, []).append(
                (ms_per_token * _tokens_per_round(acc, k) - _round_ms(cost, acc, k, extra=False)) / (k + 1)
            )
    return tuple(sorted((p, sum(r) / len(r)) for p, r in residuals.items()))


def fit(cost: CostModel, cells: Sequence[Cell]) -> CostModel:
    """``cost`` (t1 and the step costs, measured) with every other term fitted on the cells that measure
    it: s on the cells without p_min, then each threshold's own cost on its cells."""
    with_s = CostModel(cost.t1_ms, cost.t_step_ms, fit_s(cost, cells))
    return CostModel(with_s.t1_ms, with_s.t_step_ms, with_s.s_ms, fit_p_min(with_s, cells))


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
            out.append(
                Prediction(
                    acc.category, Candidate(k, acc.p_min), predict_speedup(cost, acc, k), acc.tokens_per_step(k)
                )
            )
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
class Miss:
    """A verified cell and its prediction: how far the model landed from the measurement."""

    category: str
    label: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """measured / predicted − 1 (positive: faster than predicted)."""
        return self.measured / self.predicted - 1.0 if self.predicted else math.inf


def misses(
    predictions: Iterable[Prediction], verified: Iterable[tuple[str, str, float]], tolerance: float = OFF_BY
) -> list[Miss]:
    """The verified cells whose prediction is off by more than ``tolerance``, worst first."""
    preds = {(p.category, p.candidate.label): p.speedup for p in predictions}
    out = [
        Miss(cat, label, preds[(cat, label)], measured) for cat, label, measured in verified if (cat, label) in preds
    ]
    return sorted((m for m in out if abs(m.error) > tolerance), key=lambda m: -abs(m.error))


@dataclass(frozen=True)
class Choice:
    """What --budget auto uses for one category: a candidate, or None = plain decoding pays best."""

    category: str
    candidate: Candidate | None
    predicted: float | None  # predicted speedup of the candidate
    measured: float | None  # measured speedup over plain in the verification run (None: not verified)

    def to_record(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "category": self.category,
            "budget": c.budget if c else None,
            "p_min": c.p_min if c else None,
            "plain": c is None,
            "predicted": self.predicted,
            "measured": self.measured,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Choice:
        c = None if rec.get("plain") else Candidate(int(rec["budget"]), float(rec.get("p_min") or 0.0))
        return cls(
            category=str(rec["category"]), candidate=c, predicted=rec.get("predicted"), measured=rec.get("measured")
        )


def choose(
    predictions: Sequence[Prediction], category: str, measured: Mapping[Candidate, float] | None = None
) -> Choice:
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
