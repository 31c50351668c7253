"""`dspark tune`: measure the cost model and the workload's acceptance through the bench machinery (one
llama-server per arm, every record in one JSONL), predict every (budget, p_min), verify the best side by
side with plain decoding, and store the result where `--budget auto` finds it.

Three bench runs, one JSONL (run ids ``<id>-cost``, ``<id>-acceptance``, ``<id>-verify``):

1. cost: plain decoding (t1) and, per candidate budget k, an all-rejected ``--spec-synth-len 1`` cell
   (t_step(k)) on a few prompts; skipped when a stored tuning for the same key already holds these budgets.
2. acceptance: the largest budget, once per p_min (p 0 always), on every prompt: per-position acceptance
   per category from /metrics; s (ms per accepted token) is fitted on the p 0 cells, each threshold's own
   cost on its cells (``budget.model.fit``).
3. verify: plain and each category's best predicted candidates, measured in the same run (with
   ``adaptive``, also llama.cpp's per-step budget on this cost model: ``--spec-draft-n-max auto``). When a
   verified cell is more than 10 % off its prediction, the model's ranking is not to be trusted: the
   remaining candidates are measured too (``<id>-verify-rest``), so the pick is the best measured cell of
   the whole grid, not the model's.

The model and the pick are pure (``budget.model``), the key and the store are ``budget.store``'s; this
module runs the cells and keeps the records.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dsparkcli import config
from dsparkcli.bench.plan import ADAPTIVE_LABEL, Arm, BenchPlan, Draft
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import PLAIN, CountersRecord, RequestRecord, measured, read_jsonl
from dsparkcli.bench.run import new_pool, new_run_id, run_bench
from dsparkcli.bench.servers import ServerPool
from dsparkcli.bench.summaries import ALL, SummaryRecord, written_summaries
from dsparkcli.budget import methods, model, store
from dsparkcli.budget.limits import DraftLimit
from dsparkcli.budget.model import Acceptance, Candidate, CostModel
from dsparkcli.budget.record import TuningRecord
from dsparkcli.errors import BenchError, UsageError
from dsparkcli.gguf.analysis import dspark_structure
from dsparkcli.gguf.pairing import open_header
from dsparkcli.llama import speculation
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.protocol import SpecCounters
from dsparkcli.pairs import draft_limit

DEFAULT_BUDGETS = (1, 2, 3, 5, 7, 10, 15)  # every budget of the H200 study
SYNTH_MODES = ("rates", "length")
COST_PROMPTS = 4  # prompts per cost cell: a step's cost hardly depends on the text


@dataclass(frozen=True)
class TunePlan:
    target: Path
    draft: Path
    prompts: tuple[Prompt, ...]
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    p_mins: tuple[float, ...] = (0.0,)
    mmproj: Path | None = None
    reps: int = 1
    warmup: int = 1
    n_predict: int = 128
    cost_n_predict: int | None = None  # tokens per cost-cell request (None: n_predict); a step's cost needs few
    ctx: int | None = None
    threads: int | None = None
    extra_args: tuple[str, ...] = ()
    top: int = 2  # candidates per category measured in the verification run
    # SYNTHETIC acceptance: L at the largest budget. "rates": smaller budgets see the same per-position
    # rates (--spec-synth-rates, as a real draft would); "length": mean L at every budget (--spec-synth-len,
    # BENCHMARKS.md's grid), which only budgets k >= L - 1 can hold
    synth_len: float | None = None
    synth_mode: str = "rates"
    seed: int = 0
    ignore_eos: bool = False
    reuse_cost: bool = True
    deadline: float | None = None  # time.monotonic() after which no more cells start (verification is cut)
    model_name: str | None = None
    upstream_acceptance: tuple[tuple[str, float], ...] = ()
    scripted: str | None = None  # why the pair's own acceptance is synthetic (bench.plan.BenchInputs.scripted)
    adaptive: bool = False  # verify llama.cpp's adaptive budget (the measured cost table) next to the picks
    # tune --methods (budget.methods labels): the n-gram and chain ones are measured in the verification run;
    # the pick per category is among these (empty: budgets only, no method choice)
    methods: tuple[str, ...] = ()

    @property
    def k_max(self) -> int:
        return max(self.budgets)

    @property
    def thresholds(self) -> tuple[float, ...]:
        """The p_mins measured: p 0 always (s is fitted on its cells, and the adaptive budget drafts at p 0)."""
        return tuple(dict.fromkeys((0.0, *self.p_mins)))

    @property
    def synthetic(self) -> bool:
        return self.synth_len is not None or self.scripted is not None

    def runnable(self, k: int) -> bool:
        """Budget k can emulate this plan's synthetic acceptance (always true with real acceptance)."""
        return self.synth_len is None or self.synth_mode == "rates" or self.synth_len <= k + 1

    def validate(self) -> None:
        if not self.budgets or any(b < 1 for b in self.budgets) or len(set(self.budgets)) != len(self.budgets):
            raise UsageError("--budgets must be distinct integers >= 1")
        if any(not 0.0 <= p <= 1.0 for p in self.p_mins) or len(set(self.p_mins)) != len(self.p_mins):
            raise UsageError("--p-min values must be distinct and within [0, 1]")
        if self.synth_mode not in SYNTH_MODES:
            raise UsageError(f"--synth-mode must be one of {', '.join(SYNTH_MODES)} (got {self.synth_mode})")
        if self.synth_len is not None and not 1.0 <= self.synth_len <= self.k_max + 1:
            raise UsageError(f"--synth-len must be within [1, {self.k_max + 1}] for budget {self.k_max}")
        if self.synth_len is not None and any(p > 0 for p in self.p_mins):
            raise UsageError("--p-min with --synth-len: synthetic acceptance ignores the draft's confidence")
        if self.top < 1:
            raise UsageError("--top must be at least 1")
        if self.synth_len is not None and set(self.methods) - {speculation.PLAIN, speculation.DSPARK}:
            raise UsageError("--methods with --synth-len: n-gram drafts cannot be emulated; give plain and dspark")
        if not self.prompts:
            raise UsageError("no prompts selected")


def draft_limits(draft: Path) -> tuple[DraftLimit, bool]:
    """(the budgets the draft can honour, has a confidence head) from the draft's header."""
    s = dspark_structure(open_header(draft))
    return draft_limit(draft), bool(s is not None and s.confidence_head)


# ------------------------------------------------------------------ measuring


@dataclass(frozen=True)
class Progress:
    phase: str  # cost | acceptance | verify
    arm: str
    done: int
    total: int


class _OutOfTime(Exception):
    pass


@dataclass(frozen=True)
class PhaseRecords:
    """One phase's bench records, typed: its requests and counters (acceptance) and the summary rows it
    wrote (tok/s: costs and speedups)."""

    requests: tuple[RequestRecord, ...]
    counters: tuple[CountersRecord, ...]
    summaries: tuple[SummaryRecord, ...]


def phase_records(out: Path, run_id: str) -> PhaseRecords:
    """The records of run ``run_id`` in ``out`` (a phase cut short: what it wrote)."""
    records = read_jsonl(out, run_id)
    requests, counters = measured(records)
    rows = tuple(s for s in written_summaries(records) if isinstance(s, SummaryRecord))
    return PhaseRecords(tuple(requests), tuple(counters), rows)


def _bench(
    engine: Engine,
    plan: BenchPlan,
    out: Path,
    run_id: str,
    phase: str,
    deadline: float | None,
    on_progress: Callable[[Progress], None] | None,
    argv: list[str] | None,
    pool: ServerPool,
) -> PhaseRecords:
    done = [0]
    total = plan.total_requests()

    def on_request(arm: str, prompt_id: str) -> None:
        done[0] += 1
        if on_progress:
            on_progress(Progress(phase, arm, done[0], total))
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime(phase)

    run_bench(engine, plan, out=out, run_id=run_id, argv=argv, on_request=on_request, pool=pool)
    return phase_records(out, run_id)


def _base_plan(tp: TunePlan, prompts: Sequence[Prompt], arms: Sequence[Arm]) -> BenchPlan:
    return BenchPlan(
        target=tp.target,
        drafts=(Draft("draft", tp.draft),),
        budgets=(),
        prompts=tuple(prompts),
        mmproj=tp.mmproj,
        reps=tp.reps,
        warmup=tp.warmup,
        n_predict=tp.n_predict,
        ctx=tp.ctx,
        seed=tp.seed,
        ignore_eos=tp.ignore_eos,
        threads=tp.threads,
        extra_args=tp.extra_args,
        explicit_arms=tuple(arms),
        model_name=tp.model_name,
        upstream_acceptance=tp.upstream_acceptance,
        scripted=tp.scripted,
    )


def _tok_s(summaries: Sequence[SummaryRecord]) -> dict[tuple[str, str], float]:
    """(config, category) -> median tok/s over reps (bench's figure)."""
    return {(s.config, s.category): float(s.tok_s.median or 0.0) for s in summaries}


def _ms_per_token(summaries: Sequence[SummaryRecord], config_name: str, category: str = ALL) -> float:
    value = _tok_s(summaries).get((config_name, category))
    if not value:
        raise BenchError(f"tune: no timing for {config_name} ({category}) in the records")
    return 1000.0 / value


def _speedups(summaries: Sequence[SummaryRecord]) -> dict[tuple[str, str], float]:
    """(config, category) -> tok/s over plain decoding's, same category, same run (bench's speedup)."""
    speed = _tok_s(summaries)
    return {
        (c, cat): v / speed[(PLAIN, cat)]
        for (c, cat), v in speed.items()
        if c != PLAIN and v and speed.get((PLAIN, cat))
    }


def _cost_arms(tp: TunePlan, budgets: Sequence[int]) -> list[Arm]:
    d = Draft("draft", tp.draft)
    return [Arm(f"cost@{k}", d, k, p_min=0.0, synth_len=1.0) for k in budgets]


def _acceptance_arms(tp: TunePlan) -> list[Arm]:
    d = Draft("draft", tp.draft)
    return [Arm(_acceptance_name(tp.k_max, p), d, tp.k_max, p_min=p, synth_len=tp.synth_len) for p in tp.thresholds]


def _acceptance_name(k: int, p_min: float) -> str:
    return f"acc@{k}" + (f",p{p_min:g}" if p_min else "")


def candidate_arm(tp: TunePlan, c: Candidate) -> Arm:
    """The server arm of one candidate, with the plan's synthetic acceptance emulated at budget k."""
    d, name = Draft("draft", tp.draft), c.label
    if tp.synth_len is None:
        return Arm(name, d, c.budget, p_min=c.p_min)
    if tp.synth_mode == "rates" and c.budget < tp.k_max:
        return Arm(name, d, c.budget, p_min=0.0, synth_rates=model.synth_rates(tp.synth_len, tp.k_max)[: c.budget])
    return Arm(name, d, c.budget, p_min=0.0, synth_len=tp.synth_len)


def method_arms(tp: TunePlan, overall: Candidate | None) -> dict[str, Arm]:
    """tune --methods' n-gram and chain arms by name; a chain runs the DSpark draft at the overall pick
    (predicted; plain predicted: the smallest budget), its name the chain's label @ that budget."""
    c, specs = overall or Candidate(min(tp.budgets), 0.0), filter(None, map(methods.speculation_of, tp.methods))
    chain = lambda s: Arm(f"{s.label}@{c.budget}", Draft(s.label, tp.draft), c.budget, spec=s, p_min=c.p_min)  # noqa: E731
    return {a.name: a for a in (chain(s) if s.uses_dspark else Arm(s.label, spec=s) for s in specs)}


def adaptive_arm(tp: TunePlan, table: Path) -> Arm:
    """The adaptive budget's arm: cap k_max, the same emulated draft as the largest budget's."""
    d = Draft("draft", tp.draft)
    if tp.synth_len is None:
        return Arm(ADAPTIVE_LABEL, d, tp.k_max, p_min=0.0, cost_table=table)
    if tp.synth_mode == "rates":
        return Arm(
            ADAPTIVE_LABEL,
            d,
            tp.k_max,
            p_min=0.0,
            synth_rates=model.synth_rates(tp.synth_len, tp.k_max),
            cost_table=table,
        )
    return Arm(ADAPTIVE_LABEL, d, tp.k_max, p_min=0.0, synth_len=tp.synth_len, cost_table=table)


def _acceptance(phase: PhaseRecords, arm: Arm, p_min: float, categories: Sequence[str]) -> list[Acceptance]:
    out = []
    for cat in categories:
        reqs = [r for r in phase.requests if r.config == arm.name and r.category == cat]
        total = SpecCounters.total(c.counters for c in phase.counters if c.config == arm.name and c.category == cat)
        out.append(Acceptance(cat, arm.budget or 0, p_min, total, sum(r.n_predicted for r in reqs), len(reqs)))
    return out


def _cells(phase: PhaseRecords, arms: Sequence[Arm], categories: Sequence[str]) -> list[model.Cell]:
    """The acceptance phase's cells: per arm (one p_min each) and category, the acceptance and ms per token."""
    cells = []
    for arm in arms:
        assert arm.p_min is not None
        cells += [
            (a, _ms_per_token(phase.summaries, arm.name, a.category))
            for a in _acceptance(phase, arm, arm.p_min, categories)
        ]
    return cells


def refit(rec: TuningRecord, jsonl: Path) -> CostModel:
    """A stored tuning's cost model fitted again from its own bench records (``rec.jsonl``): t1 and the
    step costs as measured, every other term by ``budget.model.fit`` (a version 1 record's s was fitted
    over the p_min cells too)."""
    phase = phase_records(jsonl, f"{rec.run_id}-acceptance")
    k_max = max(a.budget for a in rec.acceptance)
    d = Draft("draft", Path("draft.gguf"))
    arms = [Arm(_acceptance_name(k_max, p), d, k_max, p_min=p) for p in dict.fromkeys(a.p_min for a in rec.acceptance)]
    return model.fit(
        CostModel(rec.cost.t1_ms, rec.cost.t_step_ms),
        _cells(phase, arms, list(dict.fromkeys(a.category for a in rec.acceptance))),
    )


def run_tune(
    engine: Engine,
    tp: TunePlan,
    *,
    out: Path | None = None,
    run_id: str | None = None,
    argv: list[str] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_phase: Callable[[str, float], None] | None = None,
    pool: ServerPool | None = None,
) -> TuningRecord:
    """Measure, predict, verify; return the tuning record this run measured, and store it (joined with the
    stored tuning of the same key: categories this run did not tune are kept, ``budget.record.merged``).
    Ctrl-C keeps what was measured as an incomplete record next to the bench records (``--budget auto``
    never reads it) and re-raises.

    Servers come from ``pool`` (kept by the caller across several tunes of one pair) or from one of
    this run's own: a plain and a draft server stay loaded between phases and serve every later cell of
    the same configuration. Budgets do not share a server by default: on the H200 stand-in a budget k
    run through a per-request n_max on a server started at 15 stepped up to ~15 % slower than on its own
    server (BENCHMARKS.md), which biases the cost model; a sharing pool (``new_pool(share=True)``) is
    the caller's choice."""
    if pool is None:
        with new_pool(engine, share=False) as own:
            return run_tune(
                engine, tp, out=out, run_id=run_id, argv=argv, on_progress=on_progress, on_phase=on_phase, pool=own
            )
    tp.validate()
    t0 = time.monotonic()
    run_id = run_id or new_run_id()
    out = Path(out) if out is not None else config.cache_dir() / "tuning" / "runs" / f"tune-{run_id}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    categories = list(dict.fromkeys(p.category for p in tp.prompts))
    workloads_of = [*categories, model.OVERALL]
    budgets = sorted(b for b in tp.budgets if tp.runnable(b))
    if not budgets:
        raise UsageError(f"no candidate budget can hold --synth-len {tp.synth_len} with --synth-mode length")
    # the key of the servers this tune measures, as bench and run serve the same settings (budget.store)
    key_plan = _base_plan(tp, tp.prompts, _acceptance_arms(tp))
    key = store.key_for(engine, key_plan.server_config(key_plan.explicit_arms[0]))
    timings: dict[str, float] = {}
    cost: CostModel | None = None
    acceptance: list[Acceptance] = []
    predictions: list[model.Prediction] = []
    verified: list[tuple[str, str, float]] = []
    choices: list[model.Choice] = []
    measured_methods: list[tuple[str, str, float]] = []  # (category, method arm, speedup): --methods
    method_rows: tuple[tuple[str, str, float], ...] = ()
    method_choices: tuple[tuple[str, str], ...] = ()
    by_method: dict[str, Arm] = {}

    def record(complete: bool) -> TuningRecord:
        return TuningRecord(
            key=key,
            cost=cost or CostModel(0.0, ()),
            acceptance=tuple(acceptance),
            predictions=tuple(predictions),
            choices=tuple(choices),
            verified=tuple(verified),
            budgets=tuple(budgets),
            p_mins=tp.thresholds,
            synthetic=tp.synthetic,
            synth_len=tp.synth_len,
            timings_s=dict(timings),
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            run_id=run_id,
            jsonl=str(out),
            complete=complete,
            overall_of=tuple(categories),
            methods=method_rows,
            method_choices=method_choices,
        )

    def phase_done(name: str, started: float) -> None:
        timings[name] = time.monotonic() - started
        if on_phase:
            on_phase(name, timings[name])

    def verify(candidates: list[Candidate], extra: list[Arm], suffix: str) -> None:
        """Measure candidates (and extra arms) next to plain; their speedups join ``verified``."""
        by_arm = {candidate_arm(tp, c).name: c for c in candidates}
        plan = _base_plan(tp, tp.prompts, [candidate_arm(tp, c) for c in candidates] + extra)
        try:
            phase = _bench(engine, plan, out, f"{run_id}-{suffix}", "verify", tp.deadline, on_progress, argv, pool)
        except _OutOfTime:
            phase = phase_records(out, f"{run_id}-{suffix}")  # keep the predictions' choices, say so
            timings["verify_cut"] = 1.0
        for (name, cat), speedup in _speedups(phase.summaries).items():
            if name in by_arm or name == ADAPTIVE_LABEL:
                verified.append(
                    (model.OVERALL if cat == ALL else cat, by_arm[name].label if name in by_arm else name, speedup)
                )
            elif name in by_method:
                measured_methods.append((model.OVERALL if cat == ALL else cat, name, speedup))

    try:
        # 1. cost model
        started = time.monotonic()
        previous = store.find(key) if tp.reuse_cost else None
        if (
            previous is not None
            and previous.cost.t1_ms > 0
            and set(budgets) <= {k for k, _ in previous.cost.t_step_ms}
        ):
            cost = CostModel(previous.cost.t1_ms, tuple((k, v) for k, v in previous.cost.t_step_ms if k in budgets))
            timings["cost_reused"] = 1.0
        else:
            few = _first_per_category(tp.prompts, COST_PROMPTS)
            cost_plan = replace(
                _base_plan(tp, few, _cost_arms(tp, budgets)), n_predict=tp.cost_n_predict or tp.n_predict
            )
            phase = _bench(engine, cost_plan, out, f"{run_id}-cost", "cost", tp.deadline, on_progress, argv, pool)
            cost = CostModel(
                t1_ms=_ms_per_token(phase.summaries, PLAIN),
                t_step_ms=tuple((k, _ms_per_token(phase.summaries, f"cost@{k}")) for k in budgets),
            )
        phase_done("cost", started)
        # 2. acceptance at the largest budget, per p_min; s from the p 0 cells, each p_min's cost from its own
        started = time.monotonic()
        arms = _acceptance_arms(tp)
        acc_plan = replace(_base_plan(tp, tp.prompts, arms), with_plain=False)
        phase = _bench(
            engine, acc_plan, out, f"{run_id}-acceptance", "acceptance", tp.deadline, on_progress, argv, pool
        )
        cells = _cells(phase, arms, categories)
        acceptance.extend(a for a, _ in cells)
        cost = model.fit(cost, cells)
        workloads = acceptance + [model.pooled([a for a in acceptance if a.p_min == p]) for p in tp.thresholds]
        predictions = model.predict_all(cost, workloads, budgets)
        choices = [model.choose(predictions, cat) for cat in workloads_of]
        phase_done("acceptance", started)
        # 3. verification: plain and the best predicted candidates, side by side; the whole grid when the
        # model missed a verified cell by more than 10 %
        started = time.monotonic()
        short = model.shortlist(predictions, workloads_of, tp.top)
        extra = []
        if tp.adaptive:  # the same cost model, as the table llama.cpp reads
            table = out.with_suffix(".cost.txt")
            table.write_text(model.cost_table(cost), encoding="utf-8")
            extra = [adaptive_arm(tp, table)]
        # --methods: n-gram and chain arms beside plain and the candidates, measured in the same run
        by_method = method_arms(tp, next((c.candidate for c in choices if c.category == model.OVERALL), None))
        extra += list(by_method.values())
        if short or extra:
            verify(short, extra, "verify")
        grid = {p.candidate.label: p.candidate for p in predictions}
        if "verify_cut" not in timings and model.misses(predictions, verified):
            rest = [c for c in grid.values() if c not in short]
            if rest:
                timings["verify_rest"] = float(len(rest))
                verify(rest, [], "verify-rest")
        if "verify_cut" not in timings and verified:  # the best measured cell wins (plain: 1.0)
            choices = [
                model.choose(
                    predictions,
                    cat,
                    {grid[label]: speedup for c, label, speedup in verified if c == cat and label in grid},
                )
                for cat in workloads_of
            ]
        if tp.methods and "verify_cut" not in timings:
            method_rows, method_choices = methods.picks(tp.methods, choices, measured_methods)
        phase_done("verify", started)
    except (KeyboardInterrupt, _OutOfTime) as exc:
        timings["total"] = time.monotonic() - t0
        store.write(record(complete=False), out.with_suffix(".partial.json"))
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise BenchError(
            f"tune ran out of time in its {exc.args[0]} phase (--max-minutes); what was measured is in {out}"
        ) from None
    timings["total"] = time.monotonic() - t0
    rec = record(complete=True)
    store.save(rec)
    return rec


def _first_per_category(prompts: Sequence[Prompt], n: int) -> tuple[Prompt, ...]:
    """Up to n prompts, one per category first (the cost cells: a step's cost hardly depends on the text)."""
    seen: dict[str, Prompt] = {}
    for p in prompts:
        seen.setdefault(p.category, p)
    picked = list(seen.values())[:n]
    return tuple(picked) if picked else tuple(prompts[:n])
