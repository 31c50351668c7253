"""The adaptive draft budget of dspark's llama.cpp patch (``--spec-draft-n-max auto``), written once in
Python: the ``--spec-cost-table`` file format, and the engine's per-step choice of the draft length,
step for step (common/speculative.cpp ``common_speculative_budget_choose`` / ``_accept``), so that
tests and tune predict exactly which k a slot drafts.

Before each draft the engine picks k in 0..n_max with the most expected tokens per ms::

    value(0) = 1 / T[0]        value(k) = (1 + E_k) / (T[k] + s·E_k)        E_k = Σ_{j<k} Π_{i≤j} r_i

T[k] is the table's cost of a step that drafts k tokens and accepts none (T[0]: a plain decode), s the
cost of each accepted token, and r_i = (acc_i + PRIOR) / (reach_i + 1) the request's own estimate of
P(position i accepted | positions < i accepted): ``reach_i`` counts its steps that drafted position i
with everything before it accepted, ``acc_i`` those in which i was accepted too. Every choice first
multiplies both by DECAY, so a request whose drafts stopped paying (k = 0, no observations) drifts back
to the prior and tries again; a larger k wins only when it is better by a relative TIE (which also
absorbs the engine's fused multiply-adds). Estimates start empty for every request.

Standard library only (scripts on a GPU machine import it with nothing else installed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

PRIOR = 0.8  # common_speculative_budget::PRIOR
DECAY = 0.95  # common_speculative_budget::DECAY
TIE = 1e-9  # common_speculative_budget::TIE
MAX_K = 1024  # the longest draft a table may price


class CostTableError(ValueError):
    """A cost table the engine would refuse (the message names the line)."""


@dataclass(frozen=True)
class CostTable:
    """``step_ms[k]``: ms of a step that drafts k tokens and accepts none (k = 0: a plain decode, per
    token); ``accept_ms``: what each accepted token adds. Lengths between measured ones are filled
    as the engine fills them (``from_points``)."""

    step_ms: tuple[float, ...]
    accept_ms: float = 0.0

    @property
    def max_k(self) -> int:
        return len(self.step_ms) - 1

    @classmethod
    def from_points(cls, points: Mapping[int, float], accept_ms: float = 0.0) -> CostTable:
        """From measured (k, ms): linear between measured lengths, the smallest measured length's cost
        below it (budget.model.CostModel.step's rule), exactly as the engine's loader computes it."""
        if 0 not in points or points[0] <= 0 or len(points) < 2:
            raise CostTableError("a cost table needs '0 MS' (a plain decode, > 0) and at least one draft length")
        ks = sorted(points)
        out = [float(points[0])]
        for k in range(1, ks[-1] + 1):
            hi = next(m for m in ks if m >= k)
            lo = max(m for m in ks if m < k)
            if hi == k or lo == 0:
                out.append(float(points[hi]))
            else:
                out.append(points[lo] + (points[hi] - points[lo]) * float(k - lo) / float(hi - lo))
        return cls(tuple(out), float(accept_ms))


def format_cost_table(points: Mapping[int, float], accept_ms: float, comment: str = "") -> str:
    """The file ``--spec-cost-table`` reads: ``# comment`` lines, ``s MS``, then ``K MS`` per measured k
    (k = 0: plain decoding, ms per token). Six decimals: the engine and ``parse_cost_table`` read the
    same doubles from them."""
    lines = [f"# {c}" for c in comment.splitlines()] if comment else []
    lines += [
        "# k = drafts per step, ms per step with nothing accepted; k = 0 is plain decoding (ms per token)",
        "# s = ms each accepted token adds to a step",
        f"s {accept_ms:.6f}",
    ]
    lines += [f"{k} {points[k]:.6f}" for k in sorted(points)]
    return "\n".join(lines) + "\n"


def parse_cost_table(text: str, name: str = "cost table") -> CostTable:
    """common_speculative_cost_table_load: the same lines accepted, the same refused."""
    points: dict[int, float] = {}
    s = 0.0
    for n, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            if len(fields) != 2:
                raise ValueError
            ms = float(fields[1])
        except ValueError:
            raise CostTableError(f"{name}:{n}: expected 'K MS' or 's MS'") from None
        if not math.isfinite(ms) or ms < 0:
            raise CostTableError(f"{name}:{n}: expected 'K MS' or 's MS'")
        if fields[0] == "s":
            s = ms
            continue
        if not fields[0].isdigit() or int(fields[0]) > MAX_K:
            raise CostTableError(f"{name}:{n}: '{fields[0]}' is not a draft length 0..{MAX_K} or 's'")
        points[int(fields[0])] = ms
    return CostTable.from_points(points, s)


@dataclass(frozen=True)
class Estimate:
    """One request's acceptance estimate (common_speculative_budget): decayed counts per position."""

    reach: tuple[float, ...] = ()
    acc: tuple[float, ...] = ()

    def rate(self, i: int) -> float:
        """r_i: P(position i accepted | positions < i accepted), with the prior."""
        reach = self.reach[i] if i < len(self.reach) else 0.0
        acc = self.acc[i] if i < len(self.acc) else 0.0
        return (acc + PRIOR) / (reach + 1.0)


def _padded(values: tuple[float, ...], n: int) -> list[float]:
    return list(values) + [0.0] * (n - len(values))


def values(est: Estimate, table: CostTable, n_max: int) -> list[float]:
    """Expected tokens per ms of every k in 0..min(n_max, table.max_k), as the engine computes them."""
    n_max = max(0, min(n_max, table.max_k))
    out = [1.0 / table.step_ms[0]]
    p, e = 1.0, 0.0
    for k in range(1, n_max + 1):
        p = p * est.rate(k - 1)
        e = e + p
        out.append((1.0 + e) / (table.step_ms[k] + table.accept_ms * e))
    return out


def choose(est: Estimate, table: CostTable, n_max: int) -> tuple[int, Estimate]:
    """This step's draft length (0 = no draft) and the estimate after the choice's decay."""
    vals = values(est, table, n_max)
    k_best, v_best = 0, vals[0]
    for k, v in enumerate(vals[1:], 1):
        if v > v_best * (1.0 + TIE):
            k_best, v_best = k, v
    n = max(len(est.reach), len(vals) - 1)
    reach, acc = _padded(est.reach, n), _padded(est.acc, n)
    return k_best, Estimate(tuple(x * DECAY for x in reach), tuple(x * DECAY for x in acc))


def accept(est: Estimate, drafted: int, accepted: int) -> Estimate:
    """The verification of a step that drafted ``drafted`` tokens and had ``accepted`` of them accepted."""
    n = max(len(est.reach), drafted)
    reach, acc = _padded(est.reach, n), _padded(est.acc, n)
    for i in range(min(drafted, accepted + 1)):
        reach[i] += 1.0
        if i < accepted:
            acc[i] += 1.0
    return Estimate(tuple(reach), tuple(acc))


def margin(est: Estimate, table: CostTable, n_max: int) -> float:
    """How far this choice is from flipping: the smallest relative gap in the comparisons the scan makes
    (each k against the best so far, times 1 + TIE). Tests assert it is well above float noise, so a
    prediction never hangs on the last bit of the engine's arithmetic (it may fuse multiply-adds)."""
    vals = values(est, table, n_max)
    best, gap = vals[0], math.inf
    for v in vals[1:]:
        bar = best * (1.0 + TIE)
        gap = min(gap, abs(v / bar - 1.0))
        if v > bar:
            best = v
    return gap


def best_case(table: CostTable) -> tuple[int, float]:
    """(k, speedup over plain) of the table's best draft length if every drafted token were accepted:
    (k + 1) · T[0] / (T[k] + s·k). value(k) only grows with the expected accepted count E_k ≤ k while a
    step costs more than an accepted token (T[k] > s), so when this is at most 1.0 no estimate can make
    ``choose`` draft: the adaptive budget decodes as plain does at every step, and the loaded draft is
    only a cost (about 2 % a token on a 2-core CPU, BENCHMARKS.md)."""
    speedups = {
        k: (k + 1) * table.step_ms[0] / (table.step_ms[k] + table.accept_ms * k) for k in range(1, table.max_k + 1)
    }  # a table prices at least one draft length
    k = max(speedups, key=speedups.__getitem__)
    return k, speedups[k]
