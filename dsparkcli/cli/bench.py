"""`dspark bench --budget 5 15`: plain vs every draft × budget on a prompt kit, side by side
(`--concurrency 1 2 4 8`: the same with N clients in flight)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import click
import typer
from typer.core import TyperCommand

from dsparkcli.bench import prompts as kit
from dsparkcli.bench.jsonl import foreign_jsonl
from dsparkcli.budget.limits import ADAPTIVE, parse_auto
from dsparkcli.cli._common import (
    SEED,
    AutoPMinOpt,
    BudgetsOpt,
    CategoriesOpt,
    CtxOpt,
    DraftDeviceOpt,
    DraftsOpt,
    IgnoreEosOpt,
    JsonOpt,
    LimitOpt,
    LlamaBinOpt,
    MainGpuOpt,
    MmprojOpt,
    ModelOpt,
    NPredictOpt,
    PromptsOpt,
    RepsOpt,
    RpcOpt,
    SeedOpt,
    SpecsOpt,
    SplitModeOpt,
    SynthLenOpt,
    TargetOpt,
    TensorSplitOpt,
    ThreadsOpt,
    WarmupOpt,
    YesOpt,
    passthrough_args,
    placement_of,
)
from dsparkcli.cli._output import err
from dsparkcli.errors import Interrupted, UsageError
from dsparkcli.llama import speculation
from dsparkcli.llama.protocol import DEFAULT_BUDGET
from dsparkcli.outputs import check_output_file

if TYPE_CHECKING:
    from dsparkcli.bench import plan as bench_plan
    from dsparkcli.budget.choice import AutoChoice, Want
    from dsparkcli.llama import engine as engine_mod
    from dsparkcli.pairs import Downloads

# `dspark bench --help` builds only the options: the plan, the runner, the report, the tuning store and the
# engine's modules (a third of a second of imports on these machines) load when a bench runs
# (tests/test_startup.py bounds each command's start-up)

HELP = """Benchmark plain decoding against DSpark drafts at several budgets, on a prompt kit.

One llama-server per configuration (plain, then every draft x budget), load and warm-up excluded,
every prompt x rep greedy. Reports per configuration and category: median tok/s (min-max over
reps), speedup vs plain from the same run, drafted/accepted tokens, acceptance rate, mean acceptance
length, per-position acceptance, prompts identical to plain (first divergent token) and the
upstream acceptance length. Every record, with provenance, goes to a JSONL file (--out). A draft
configuration that drafts nothing is an error. Arguments after `--` go to llama-server.

--spec adds what a user would pick instead to the same table: ngram-mod / ngram-simple (llama.cpp's
n-gram speculation at its own limits; an n-gram row that drafts nothing is not an error) and
draft-simple[:MODEL] (a classic draft model with the target's tokenizer, at every --budget). The DSpark
drafts run too when --spec lists dspark or a --draft is given.

--concurrency 1 2 4 8: for every N, plain and every draft x budget on llama-server -np N (--ctx
per client), N clients streaming the kit at once, each from its own starting prompt. Reports per
configuration and N: aggregate tok/s (median over reps, min-max), per-request decode tok/s, time to
first token and end-to-end latency (p50/p95/max), speedup vs plain at the same N, acceptance, and
the N from which each draft is slower than plain (crossover).

\b
Examples:
  dspark bench --budget 5 15                         # default pair, the built-in 84-prompt kit
  dspark bench --model minicpm-v-4.7 --draft q8_0 --draft q6_k --budget 5 15 --plot bench.png
  dspark bench --target t.gguf --draft d.gguf --category text --reps 5 --format md
  dspark bench --model smollm2-135m --budget 1 2 --reps 1 --rounds 5   # interleaved: for a shared machine
  dspark bench --target t.gguf --draft q8=d-q8.gguf --draft q4=d-q4.gguf --budget 5 7
  dspark bench --target t.gguf --draft d.gguf --mmproj mm.gguf --prompts my.jsonl --out runs.jsonl
  dspark bench --budget 7 --synth-len 4 --ignore-eos   # llama.cpp's SYNTHETIC acceptance
  dspark bench --budget 5 15 -- -ngl 99 -ngld 99 -fa on
  dspark bench --target t.gguf --draft d.gguf --budget 3 --concurrency 1 2 4 8 16 --category text
  dspark bench --budget auto 5 --category code         # `dspark tune`'s pick for code vs budget 5
  dspark bench --budget 1 3 5 adaptive                 # fixed budgets vs llama.cpp's per-step pick
  dspark bench --budget 5 --rpc 127.0.0.1:50052,127.0.0.1:50053   # target on two rpc workers
  dspark bench --spec dspark --spec ngram-mod --spec ngram-simple:n_max=16 --budget 3   # vs llama.cpp's n-gram
  dspark bench --model qwen2.5-coder-1.5b --spec ngram-mod --spec draft-simple --budget 4 --category code
"""

FORMATS = ("table", "json", "csv", "md")


class BenchCommand(TyperCommand):
    """Lets ``--budget 5 15`` mean ``--budget 5 --budget 15`` (click options take one value each); same for
    ``--concurrency``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_multi_values(args, ("--budget", "-b", "--concurrency", "-C")))


def _budgets(values: list[str] | None) -> tuple[list[int], bool, bool]:
    """--budget values: integers, 'auto' (the tuning's budget) and 'adaptive' (llama.cpp's per-step pick)
    among them -> (integers, auto, adaptive)."""
    ints, auto, adaptive = [], False, False
    for v in values or []:
        parsed, is_auto = parse_auto(v, "--budget", int, adaptive=True)
        auto = auto or is_auto
        if parsed == ADAPTIVE:
            adaptive = True
        elif parsed is not None:
            ints.append(int(parsed))  # type: ignore[call-overload]
    return ints, auto, adaptive


def _chosen_budgets(
    eng: engine_mod.Engine, plan: bench_plan.BenchPlan, want: Want, *, default: int
) -> bench_plan.BenchPlan:
    """The plan's budgets checked against every draft (``budget.limits``: given ones refused when out of
    range, the default clamped and said), then --budget auto / adaptive / --p-min auto from the first
    draft's tuning (``budget.choice``, strict: bench measures what it was asked, or refuses in one line)."""
    from dsparkcli.bench import plan as bench_plan
    from dsparkcli.budget import rule
    from dsparkcli.budget.choice import Want, chosen_server
    from dsparkcli.pairs import draft_limit

    limits = [draft_limit(d.path) for d in plan.drafts]
    for b in plan.budgets:
        for limit in limits:
            limit.check(b)
    if not plan.drafts:  # --spec without dspark: a classic draft runs at the budgets, n-gram at its own limits
        if want.any:
            raise UsageError(
                "--budget auto/adaptive and --p-min auto are a DSpark draft's tuning: add --spec dspark "
                "(or --draft), or give --budget N for draft-simple"
            )
        return replace(plan, budgets=(default,)) if not plan.budgets and plan.model_drafts else plan
    if not plan.budgets and not want.budget and not want.adaptive:
        fitted = [limit.fit_default(default) for limit in limits]
        for _, note in fitted[:1]:
            if note:
                err.print(note, markup=False)
        plan = replace(plan, budgets=(min(b for b, _ in fitted),))
    if not want.any:
        return plan
    # the configuration bench serves the first draft with: its tuning key is the one tune stored
    key_cfg = plan.server_config(bench_plan.Arm("tuned", plan.drafts[0], 1))
    if want.adaptive:
        _, choice = chosen_server(eng, key_cfg, Want(adaptive=True), strict=True)
        assert choice is not None and choice.cost_table is not None
        err.print(choice.message, markup=False)
        plan = replace(
            plan,
            cost_table=choice.cost_table,
            adaptive_without_draft=choice.without_draft,
            adaptive_k=rule.parse_cost_table(choice.cost_table.read_text(encoding="utf-8")).max_k,
        )
    if want.budget or want.p_min:
        cfg, auto = chosen_server(eng, key_cfg, replace(want, adaptive=False, methods=False), strict=True)
        assert auto is not None
        err.print(auto.message, markup=False)
        picks = _picks_by_category(eng, plan, auto) if want.budget and not want.category else ()
        if picks:  # each prompt gets its category's pick on one server (dspark's per-request n_max)
            err.print(
                "--budget auto per category: "
                + ", ".join(f"{c} {k}" + (f" p-min {pm:g}" if pm else "") if k else f"{c} plain" for c, k, pm in picks)
                + " (one server at the largest, each request its category's speculative.n_max; 0: no draft)",
                markup=False,
            )
            plan = replace(plan, auto_per_category=picks)
        elif auto.without_draft:  # plain decoding won: the auto arm runs without the draft (<draft>@auto)
            plan = replace(plan, auto_without_draft=True)
        elif want.budget and auto.budget not in plan.budgets:
            plan = replace(plan, budgets=(*plan.budgets, auto.budget))  # type: ignore[arg-type]
        if want.p_min and not auto.without_draft:
            plan = replace(plan, p_min=cfg.p_min)
    return plan


def _picks_by_category(
    eng: engine_mod.Engine, plan: bench_plan.BenchPlan, auto: AutoChoice
) -> tuple[tuple[str, int, float], ...]:
    """tune's pick for each category of the plan's prompts ((category, budget, p-min), budget 0 = plain; a
    category the tuning lacks takes the overall pick), when they differ between categories and the engine
    takes per-request budgets; () otherwise (the overall pick serves every prompt, as before)."""
    from dsparkcli.llama import engine as engine_mod

    rec = auto.record
    if rec is None or not engine_mod.capabilities(eng).request_draft_params:
        return ()
    picks = []
    for category in dict.fromkeys(p.category for p in plan.prompts):
        choice = rec.choice(category) or rec.choice(None)
        c = choice.candidate if choice is not None else None
        picks.append((category, c.budget if c else 0, (c.p_min or 0.0) if c else 0.0))
    if len({(k, pm) for _, k, pm in picks}) < 2 or not any(k for _, k, _ in picks):
        return ()  # one pick for all: the overall arm (or plain without the draft) says it already
    return tuple(picks)


def _with_classic_draft(
    s: speculation.Speculation, target: Path, downloads: Downloads, pair_name: str | None
) -> speculation.Speculation:
    """A draft-simple speculation with its model resolved and checked against the target (named as given,
    or by the pair's classic_draft); an n-gram one as it is."""
    from dsparkcli.pairs import classic_draft

    if not s.uses_model:
        return s
    name, path = classic_draft(s.model, target, downloads, pair_name=pair_name)
    return replace(s, model=name, path=path)


def expand_multi_values(
    args: list[str], flags: tuple[str, ...], is_value: Callable[[str], bool] | None = None
) -> list[str]:
    """``--flag a b`` -> ``--flag a --flag b`` for the values ``is_value`` accepts (default: integers, 'auto')."""
    is_value = is_value or _is_int
    expanded: list[str] = []
    i = 0
    while i < len(args):
        expanded.append(args[i])
        if args[i] in flags:
            j = i + 1
            first = True
            while j < len(args) and is_value(args[j]):
                if not first:
                    expanded.append(args[i])
                expanded.append(args[j])
                first = False
                j += 1
            i = j
            continue
        i += 1
    return expanded


def _is_int(text: str) -> bool:
    return (text.lstrip("-").isdigit() and not text.startswith("--")) or text.lower() in ("auto", ADAPTIVE)


def bench(
    concurrency: Annotated[
        Optional[list[int]],
        typer.Option("--concurrency", "-C", min=1, help="Clients in flight (-np N): --concurrency 1 2 4 8."),
    ] = None,
    budget: BudgetsOpt = None,
    model: ModelOpt = None,
    target: TargetOpt = None,
    draft: DraftsOpt = None,
    spec: SpecsOpt = None,
    mmproj: MmprojOpt = None,
    prompts: PromptsOpt = kit.DEFAULT_KIT,
    category: CategoriesOpt = None,
    limit: LimitOpt = None,
    reps: RepsOpt = 3,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds",
            min=1,
            help="Run the configurations in turn N times, --reps each time (a fresh server each time), so a machine that drifts slows them all alike.",
        ),
    ] = 1,
    warmup: WarmupOpt = 1,
    n_predict: NPredictOpt = 256,
    ctx: CtxOpt = None,
    p_min: AutoPMinOpt = None,
    synth_len: SynthLenOpt = None,
    ignore_eos: IgnoreEosOpt = False,
    seed: SeedOpt = SEED,
    threads: ThreadsOpt = None,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Append JSONL records here (default: the dspark cache).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, json, csv or md.")] = "table",
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG of tok/s and speedup.")] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Append to an --out that is not dspark's JSONL; replace an existing --plot."),
    ] = False,
    rpc: RpcOpt = None,
    split_mode: SplitModeOpt = None,
    tensor_split: TensorSplitOpt = None,
    main_gpu: MainGpuOpt = None,
    draft_device: DraftDeviceOpt = None,
    yes: YesOpt = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    # deferred (see the imports): what a bench runs with, not what its --help needs
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dsparkcli.bench import plan as bench_plan
    from dsparkcli.bench import report
    from dsparkcli.bench import run as core
    from dsparkcli.bench.summaries import LoadSummaryRecord
    from dsparkcli.budget.choice import Want
    from dsparkcli.cli._bench_output import emit
    from dsparkcli.llama import engine as engine_mod
    from dsparkcli.llama import hazards
    from dsparkcli.llama.placement import describe as placement_describe
    from dsparkcli.pairs import Downloads, place_draft

    extra_args = passthrough_args()  # refused before anything is resolved or downloaded
    fmt = "json" if json_out else fmt.lower()
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)} (got {fmt})")
    if plot is not None and plot.suffix.lower() != ".png":
        raise UsageError(f"--plot writes a PNG: give a .png path (got {plot})")
    inputs = (target, mmproj, *(d.partition("=")[2] or d for d in draft or []), prompts)
    for path, what in ((out_path, "--out"), (plot, "--plot")):  # before the run, not after it
        if path is not None:  # a plot replaces what is there (only with --force); --out appends
            check_output_file(path, what=what, inputs=inputs, replace=force or what == "--out")
    foreign = foreign_jsonl(out_path) if out_path is not None and not force else None
    if foreign:
        raise UsageError(f"--out {out_path}: {foreign}, and bench appends JSONL records (pass --force to anyway)")
    selected = kit.select(kit.load_prompts(prompts), category, limit)
    placement = placement_of(rpc, split_mode, tensor_split, main_gpu, draft_device)
    parsed = [speculation.parse(s) for s in spec or []]  # refused before anything is resolved or downloaded
    # DSpark arms: by default, when --spec lists dspark, or when a --draft (a DSpark draft) is given; a chain
    # that ends with dspark loads the DSpark drafts too (its arms only, unless dspark itself is listed)
    dspark_arms = not parsed or any(s is None for s in parsed) or bool(draft)
    with_dspark = dspark_arms or any(s is not None and s.uses_dspark for s in parsed)
    others = tuple(dict.fromkeys(s for s in parsed if s is not None))
    budgets, auto_budget, adaptive = _budgets(budget)  # a bad value is said before the engine or the hub
    bench_plan.check_budget_values(budgets)
    bench_plan.check_given_inputs(model=model, target=target, drafts=list(draft or []), mmproj=mmproj)
    eng = engine_mod.describe(engine_mod.resolve_engine(llama_bin, rpc=bool(placement.rpc)))
    if with_dspark:
        engine_mod.require_dspark(eng)
    notice = lambda m: err.print(m, markup=False)  # noqa: E731
    inputs = bench_plan.resolve_inputs(
        model=model,
        target=target,
        drafts=list(draft or []),
        mmproj=mmproj,
        yes=yes,
        engine=eng,
        on_notice=notice,
        dspark=with_dspark,
    )
    downloads = Downloads(yes=yes, engine=eng, on_notice=notice)
    others = tuple(_with_classic_draft(s, inputs.target, downloads, inputs.model_name) for s in others)
    p_value, auto_p = parse_auto(p_min, "--p-min", float)
    for d in inputs.drafts:  # the first picks the draft's device, the others must agree with it
        placement = place_draft(placement, eng, d.path)
    if placement.rpc:
        err.print(placement_describe(placement), markup=False)
    plan = bench_plan.BenchPlan(
        target=inputs.target,
        mmproj=inputs.mmproj,
        drafts=inputs.drafts,
        budgets=tuple(budgets),
        prompts=selected,
        reps=reps,
        rounds=rounds,
        warmup=warmup,
        n_predict=n_predict,
        ctx=ctx,
        p_min=p_value,
        synth_len=synth_len,  # type: ignore[arg-type]
        ignore_eos=ignore_eos,
        seed=seed,
        threads=threads,
        extra_args=extra_args,
        upstream_acceptance=inputs.upstream_acceptance,
        model_name=inputs.model_name,
        scripted=inputs.scripted or bench_plan.scripted(inputs.target, [s.path for s in others if s.path]),
        concurrency=tuple(concurrency or ()),
        placement=placement,
        specs=others,
        dspark_arms=dspark_arms,
    )
    cats = {p.category for p in selected}  # the tuning of the one category benched, else the overall one
    plan = _chosen_budgets(
        eng,
        plan,
        Want(
            budget=auto_budget, p_min=auto_p, adaptive=adaptive, category=next(iter(cats)) if len(cats) == 1 else None
        ),
        default=inputs.budget or DEFAULT_BUDGET,
    )
    plan.validate()
    hazard = hazards.slot_hazard(eng, drafting=bool(plan.drafts or plan.specs), parallel=max(plan.concurrency or (1,)))
    if hazard:
        err.print(f"dspark: warning: {hazard}", markup=False)
    if plan.synth_len is not None:
        err.print(
            f"[bold red]SYNTHETIC acceptance (--spec-synth-len {synth_len:g}): figures emulate a draft[/bold red]"
        )
    elif plan.scripted:
        err.print(f"[bold red]SYNTHETIC acceptance ({plan.scripted}): a scripted pair, not a real draft[/bold red]")
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[where]}"),
    )
    run_id = core.new_run_id()
    jsonl = out_path or core.default_out_path(run_id)
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        task = progress.add_task("bench", total=plan.total_requests(), where="")

        def on_request(config: str, prompt_id: str) -> None:
            progress.update(task, advance=1, where=f"{config} {prompt_id}")

        try:
            result = core.run_bench(eng, plan, out=jsonl, run_id=run_id, argv=sys.argv, on_request=on_request)
        except KeyboardInterrupt:
            result = None  # the bar is gone once the `with` ends; then the table of what was measured
    if result is None:
        so_far = core.summaries_so_far(jsonl, run_id, plan.upstream_acceptance)
        partial = so_far.summaries
        if partial:
            emit(partial, so_far.provenance, fmt, run_id=run_id, jsonl=jsonl, overhead=None, partial=True)
        begun = len({(s.concurrency if isinstance(s, LoadSummaryRecord) else None, s.config) for s in partial})
        total = len(plan.arms()) * max(1, len(plan.concurrency))
        shown = (
            f"the table above is what was measured ({begun} of {total} configurations begun)"
            if partial
            else "nothing was measured yet"
        )
        raise Interrupted(f"interrupted: {shown}; the records measured so far are in {jsonl}")
    summaries = result.summaries
    ov = result.overhead
    overhead = ov.figures()
    # the table and the records' line first, the plot last: a plot that cannot be written (a full disk)
    # fails the command after what was measured is shown, not instead of it
    emit(summaries, result.provenance, fmt, run_id=result.run_id, jsonl=result.out, overhead=overhead)
    err.print(
        f"records: {result.out} (run {result.run_id}); wall {ov.ratio:.3f}x of generation + load "
        f"({ov.provenance_s:.1f} s of it hashing files)",
        markup=False,
    )
    if plot is not None:
        report.plot(summaries, plot, result.provenance)
        err.print(f"plot: {plot}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP, cls=BenchCommand)(bench)
