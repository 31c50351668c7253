"""``--budget auto`` / ``--p-min auto`` / ``--budget adaptive``: the one way run, serve and bench turn a
server configuration into the one with the chosen budget (``chosen_server``), and say in one line what
was chosen and why.

- auto: the stored tuning's pick for the category (or overall). When plain decoding beat every budget,
  the server runs without the draft and the line says so: a fixed budget that tune measured slower than
  plain is never put in its place.
- adaptive: llama.cpp picks each step's budget from the tuning's cost table (``--spec-draft-n-max auto
  --spec-cost-table``); when the table leaves no draft length worth drafting even at full acceptance
  (``rule.best_case`` ≤ 1), the engine would choose k = 0 at every step, so the draft is left out.
- no tuning for this key: the line names the setting that differs from the stored tunings of the pair
  (``store.match``), for both; run and serve then use the budget they were given, bench refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli.budget import methods, rule, store
from dsparkcli.budget.model import OVERALL
from dsparkcli.budget.record import TuningRecord
from dsparkcli.errors import EngineCapabilityError, UsageError
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import protocol, speculation
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import ServerConfig

NO_DRAFT = "so the draft is not loaded and every request decodes as plain does (--budget N keeps it)"


@dataclass(frozen=True)
class Want:
    """What the user asked of the budget: the words --budget auto|adaptive and --p-min auto, a category."""

    budget: bool = False  # --budget auto
    p_min: bool = False  # --p-min auto
    adaptive: bool = False  # --budget adaptive
    category: str | None = None  # which tuned category (None: overall)
    # --budget auto takes the tuning's method pick too (tune --methods: plain, dspark, an n-gram type, a chain);
    # bench does not: it measures the configurations it was asked for
    methods: bool = True

    @property
    def any(self) -> bool:
        return self.budget or self.p_min or self.adaptive


@dataclass(frozen=True)
class AutoChoice:
    message: str  # one line for the user
    record: TuningRecord | None = None  # None: no tuning matched (the configuration's budget applies)
    budget: int | None = None  # auto: the tuning's pick
    p_min: float | None = None
    plain: bool = False  # the tuning says plain decoding beats every budget (auto) or every draft (adaptive)
    cost_table: Path | None = None  # adaptive: the table llama.cpp chooses each step's budget from
    without_draft: bool = False  # the server runs without the draft (plain won, or no draft can pay)
    method: str | None = None  # tune --methods' pick when it is not the DSpark draft alone (budget.methods)


def require_adaptive(engine: Engine) -> None:
    """--budget adaptive needs dspark's patched llama.cpp; say how to get it before anything starts."""
    if not engine_mod.capabilities(engine).adaptive_budget:
        raise EngineCapabilityError(
            f"{engine.server} has no --spec-cost-table: --budget adaptive needs dspark's patched llama.cpp",
            hint="dspark engine build (patches are applied by default)",
        )


def chosen_server(
    engine: Engine, cfg: ServerConfig, want: Want, *, strict: bool = False
) -> tuple[ServerConfig, AutoChoice | None]:
    """``cfg`` with the chosen budget (and p-min) put in, and the line that says what was chosen; plain
    configurations and configurations nobody asked a choice of come back unchanged with None. Without a
    matching tuning ``strict`` (bench, which measures what it was asked) refuses; otherwise the
    configuration's own budget stays and the line says so."""
    if cfg.draft is None or not want.any:
        return cfg, None
    if want.adaptive:
        require_adaptive(engine)
    found = store.match(store.key_for(engine, cfg))
    rec = found.record
    if want.adaptive:
        if rec is None or not rec.cost.t_step_ms or rec.cost.t1_ms <= 0:
            why = found.why_not if rec is None else f"tuning {rec.key.id} has no step costs: run `dspark tune` again"
            return _unmatched(cfg, f"--budget adaptive: {why}", strict)
        cfg, choice = _adaptive(cfg, rec)
        if want.p_min and not choice.without_draft:
            cfg, auto_p = _auto(cfg, rec, replace(want, budget=False))
            choice = replace(choice, message=f"{choice.message}; {auto_p.message}")
        return cfg, choice
    if rec is None:
        return _unmatched(cfg, f"--{'budget' if want.budget else 'p-min'} auto: {found.why_not}", strict)
    return _auto(cfg, rec, want, strict=strict)


def _unmatched(cfg: ServerConfig, why: str, strict: bool) -> tuple[ServerConfig, AutoChoice]:
    if strict:
        raise UsageError(why)
    return cfg, AutoChoice(f"{why}; using budget {cfg.n_max}")


def _auto(
    cfg: ServerConfig, rec: TuningRecord, want: Want, *, strict: bool = False
) -> tuple[ServerConfig, AutoChoice]:
    where = f" for category {want.category}" if want.category else ""
    choice = rec.choice(want.category)
    if choice is None:
        why = (
            f"tuning {rec.key.id} has no category {want.category} (has {', '.join(rec.categories)}): "
            f"`dspark tune --category {want.category}` adds it"
        )
        if strict:
            raise UsageError(why)
        return cfg, AutoChoice(f"{why}; using budget {cfg.n_max}", rec)
    # tune --methods' pick first: where plain won the DSpark budgets an n-gram type or a chain may still have won
    # (plain winning both is the DSpark choice's own answer, said below)
    method = rec.method_choice(want.category) if want.budget and want.methods and cfg.spec_type is None else None
    if method not in (None, speculation.DSPARK) and not (method == speculation.PLAIN and choice.candidate is None):
        return _method(cfg, rec, method, want.category)  # type: ignore[arg-type]
    if choice.candidate is None:
        best = max((s for c, _, s in rec.verified if c == (want.category or OVERALL)), default=None)
        measured = f" (the best budget measured {best:.2f}x plain)" if best is not None else ""
        if not want.budget:  # --p-min auto alone: the budget is the user's, there is no p-min to pick
            return cfg, AutoChoice(
                f"tuning {rec.key.id}{where}: plain decoding beat every budget{measured}, so there is no p-min to use",
                rec,
                plain=True,
            )
        return cfg.without_draft(), AutoChoice(
            f"tuning {rec.key.id}{where}: plain decoding beat every budget{measured}, {NO_DRAFT}",
            rec,
            plain=True,
            without_draft=True,
        )
    c = choice.candidate
    gain = choice.measured if choice.measured is not None else choice.predicted
    message = (
        f"tuning {rec.key.id}{where}: budget {c.budget}"
        + (f", p-min {c.p_min:g}" if c.p_min else "")
        + (f" ({gain:.2f}x plain)" if gain else "")
    )
    return (
        replace(
            cfg, n_max=c.budget if want.budget else cfg.n_max, p_min=(c.p_min or None) if want.p_min else cfg.p_min
        ),
        AutoChoice(message, rec, budget=c.budget, p_min=c.p_min),
    )


def _method(
    cfg: ServerConfig, rec: TuningRecord, method: str, category: str | None
) -> tuple[ServerConfig, AutoChoice]:
    """``cfg`` running tune's method pick: plain, an n-gram type (no DSpark draft) or a chain at its measured
    budget; one line says which and its measured speedup."""
    speed = {m: x for c, m, x in rec.methods if c == (category or OVERALL)}
    where = f" for category {category}" if category else ""
    others = ", ".join(f"{m} {x:.2f}x" for m, x in speed.items() if m != method)
    line = f"tuning {rec.key.id}{where}: method {method} ({speed.get(method, 1.0):.2f}x plain"
    line += f", the fastest of {others})" if others else ")"
    s = methods.speculation_of(method)
    if s is None:  # plain
        return cfg.without_draft(), AutoChoice(
            f"{line}, {NO_DRAFT}", rec, plain=True, without_draft=True, method=method
        )
    if not s.uses_dspark:
        cfg = replace(cfg.without_draft(), spec_type=s.spec_type, spec_flags=s.flags())
        return cfg, AutoChoice(f"{line}: the DSpark draft is not loaded", rec, without_draft=True, method=method)
    k = methods.budget_of(method)
    cfg = replace(cfg, spec_type=s.spec_type, spec_flags=s.flags(), n_max=k or cfg.n_max)
    return cfg, AutoChoice(line, rec, budget=k, method=method)


def _adaptive(cfg: ServerConfig, rec: TuningRecord) -> tuple[ServerConfig, AutoChoice]:
    path = store.write_cost_table(rec)
    ks = [k for k, _ in rec.cost.t_step_ms]
    message = (
        f"adaptive budget: llama.cpp picks 0..{max(ks)} per step from tuning {rec.key.id}'s step costs "
        f"(measured at k = {', '.join(map(str, ks))})"
    )
    k, best = rule.best_case(rule.parse_cost_table(path.read_text(encoding="utf-8"), str(path)))
    if best <= 1.0:  # the engine would choose k = 0 at every step, whatever the acceptance
        message += (
            f"; on these step costs no draft can pay even with every token accepted (best: k = {k}, "
            f"{best:.2f}x plain), {NO_DRAFT}"
        )
        return cfg.without_draft(), AutoChoice(message, rec, plain=True, cost_table=path, without_draft=True)
    return (
        replace(cfg, n_max=protocol.AUTO, cost_table=path),
        AutoChoice(message, rec, budget=max(ks), cost_table=path),
    )


def category_budgets(choice: AutoChoice | None) -> dict[str, int]:
    """The tuning's pick per category ({category: budget}, 0 = plain decoding won), for per-request budgets."""
    if choice is None or choice.record is None or choice.without_draft:  # no draft loaded: nothing to pick
        return {}
    return {c.category: c.candidate.budget if c.candidate else 0 for c in choice.record.choices}
