"""One tune's result as stored (JSON) and read back by ``--budget auto`` / ``adaptive``, pure, and how a
tuning of some categories joins the stored one of the same key (``merged``).

Version 2: the cost model's s is fitted on the cells without p_min and each threshold has its own term
(``budget.model``). Version 1 records (s fitted over every cell) are still read, for their figures, but
``--budget auto`` does not use them (``current``).

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dsparkcli.budget.key import TuningKey
from dsparkcli.budget.model import OVERALL, Acceptance, Candidate, Choice, CostModel, Prediction

RECORD_KIND = "dspark-tuning"
RECORD_VERSION = 2
READABLE_VERSIONS = (1, 2)


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
    version: int = RECORD_VERSION
    # the categories the overall choice pooled (empty: those of ``choices``)
    overall_of: tuple[str, ...] = ()
    # tune --methods (budget.methods): each method's measured speedup per category, in the verification run
    # ((category, method label, speedup); plain 1.0), and the pick per category ((category, method label))
    methods: tuple[tuple[str, str, float], ...] = ()
    method_choices: tuple[tuple[str, str], ...] = ()

    def method_choice(self, category: str | None = None) -> str | None:
        """The method tune picked for ``category`` (None: overall); None when it measured no methods."""
        return dict(self.method_choices).get(category or OVERALL)

    def choice(self, category: str | None = None) -> Choice | None:
        wanted = category or OVERALL
        return next((c for c in self.choices if c.category == wanted), None)

    @property
    def categories(self) -> list[str]:
        return [c.category for c in self.choices]

    @property
    def tuned_categories(self) -> tuple[str, ...]:
        """The categories tuned on their own (every choice but the overall one)."""
        return tuple(c for c in self.categories if c != OVERALL)

    @property
    def current(self) -> bool:
        """Written by this model (version 2): older records charged p_min's cost to accepted tokens."""
        return self.version == RECORD_VERSION

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": RECORD_KIND,
            "version": self.version,
            "key": self.key.to_record(),
            "key_id": self.key.id,
            "created": self.created,
            "run_id": self.run_id,
            "jsonl": self.jsonl,
            "complete": self.complete,
            "synthetic": self.synthetic,
            "synth_len": self.synth_len,
            "budgets": list(self.budgets),
            "p_mins": list(self.p_mins),
            "cost": self.cost.to_record(),
            "acceptance": [a.to_record() for a in self.acceptance],
            "predictions": [
                {
                    "category": p.category,
                    "budget": p.candidate.budget,
                    "p_min": p.candidate.p_min,
                    "speedup": p.speedup,
                    "tokens_per_step": p.tokens_per_step,
                }
                for p in self.predictions
            ],
            "verified": [{"category": c, "candidate": lb, "speedup": s} for c, lb, s in self.verified],
            "choices": [c.to_record() for c in self.choices],
            "timings_s": dict(self.timings_s),
            "overall_of": list(self.overall_of),
        } | (  # written only by a tune that measured methods: other records are as they were
            {
                "methods": [{"category": c, "method": m, "speedup": x} for c, m, x in self.methods],
                "method_choices": [{"category": c, "method": m} for c, m in self.method_choices],
            }
            if self.method_choices
            else {}
        )

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> TuningRecord:
        if rec.get("kind") != RECORD_KIND or rec.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"not a dspark tuning record (versions {', '.join(map(str, READABLE_VERSIONS))})")
        return cls(
            key=TuningKey.from_record(rec["key"]),
            cost=CostModel.from_record(rec["cost"]),
            acceptance=tuple(Acceptance.from_record(a) for a in rec.get("acceptance") or ()),
            predictions=tuple(
                Prediction(
                    p["category"],
                    Candidate(int(p["budget"]), float(p["p_min"])),
                    float(p["speedup"]),
                    float(p["tokens_per_step"]),
                )
                for p in rec.get("predictions") or ()
            ),
            choices=tuple(Choice.from_record(c) for c in rec.get("choices") or ()),
            verified=tuple((v["category"], v["candidate"], float(v["speedup"])) for v in rec.get("verified") or ()),
            budgets=tuple(int(b) for b in rec.get("budgets") or ()),
            p_mins=tuple(float(p) for p in rec.get("p_mins") or (0.0,)),
            synthetic=bool(rec.get("synthetic")),
            synth_len=rec.get("synth_len"),
            timings_s=dict(rec.get("timings_s") or {}),
            created=str(rec.get("created", "")),
            run_id=str(rec.get("run_id", "")),
            jsonl=str(rec.get("jsonl", "")),
            complete=bool(rec.get("complete", True)),
            version=int(rec["version"]),
            overall_of=tuple(str(c) for c in rec.get("overall_of") or ()),
            methods=tuple((m["category"], m["method"], float(m["speedup"])) for m in rec.get("methods") or ()),
            method_choices=tuple((m["category"], m["method"]) for m in rec.get("method_choices") or ()),
        )


def merged(old: TuningRecord, new: TuningRecord) -> TuningRecord:
    """``new`` (a tune of some categories) with what ``old`` (the stored tuning of the same key) knows of the
    others: their acceptance, predictions, verified cells and choices are kept, so tuning ``--category code``
    after ``--category math`` keeps math's. The overall choice is the one pooled over more categories (a
    tune of code alone does not replace the overall pick of every category). The cost model, settings
    and timings are the new tune's: the same machine, engine and flags, measured last. A tuning of another
    acceptance (SYNTHETIC against REAL, or another emulated length) is replaced, not joined."""
    if old.key != new.key or not old.complete or not old.current:
        return new
    if (old.synthetic, old.synth_len) != (new.synthetic, new.synth_len):
        return new
    mine = set(new.tuned_categories)
    kept = [c for c in old.tuned_categories if c not in mine]
    if not kept:
        return new
    old_overall, new_overall = old.choice(), new.choice()
    old_of, new_of = old.overall_of or old.tuned_categories, new.overall_of or new.tuned_categories
    keep_old_overall = old_overall is not None and (new_overall is None or len(old_of) > len(new_of))
    overall = old_overall if keep_old_overall else new_overall

    def others(items, category_of):
        return tuple(x for x in items if category_of(x) in kept)

    return replace(
        new,
        acceptance=others(old.acceptance, lambda a: a.category) + new.acceptance,
        predictions=tuple(p for p in new.predictions if p.category != OVERALL or not keep_old_overall)
        + others(old.predictions, lambda p: p.category)
        + (tuple(p for p in old.predictions if p.category == OVERALL) if keep_old_overall else ()),
        verified=tuple(v for v in new.verified if v[0] != OVERALL or not keep_old_overall)
        + others(old.verified, lambda v: v[0])
        + (tuple(v for v in old.verified if v[0] == OVERALL) if keep_old_overall else ()),
        choices=others(old.choices, lambda c: c.category)
        + tuple(c for c in new.choices if c.category != OVERALL)
        + ((overall,) if overall else ()),
        overall_of=tuple(old_of if keep_old_overall else new_of),
        # a method pick is only as good as the run that measured its category beside the others
        methods=_joined(old.methods, new.methods, kept, keep_old_overall),
        method_choices=_joined(old.method_choices, new.method_choices, kept, keep_old_overall),
    )


def _joined(old: tuple, new: tuple, kept: list[str], keep_old_overall: bool) -> tuple:
    """Per-category rows (category first) of ``merged``: the new tune's, the kept categories' old ones, and
    the overall row of whichever overall choice is kept."""
    return (
        tuple(x for x in new if x[0] != OVERALL or not keep_old_overall)
        + tuple(x for x in old if x[0] in kept)
        + (tuple(x for x in old if x[0] == OVERALL) if keep_old_overall else ())
    )
