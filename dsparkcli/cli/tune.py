"""`dspark tune`: the budget and p-min for this pair, machine and workload, from a measured cost model."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import click
import typer
from typer.core import TyperCommand

from dsparkcli.bench import prompts as kit
from dsparkcli.cli._common import (
    SEED,
    CategoriesOpt,
    CtxOpt,
    DraftOpt,
    IgnoreEosOpt,
    JsonOpt,
    LimitOpt,
    LlamaBinOpt,
    MethodsOpt,
    MmprojOpt,
    ModelOpt,
    NPredictOpt,
    PMinsOpt,
    PromptsOpt,
    RepsOpt,
    SeedOpt,
    SynthLenOpt,
    TargetOpt,
    ThreadsOpt,
    WarmupOpt,
    YesOpt,
    passthrough_args,
)
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.cli.bench import expand_multi_values
from dsparkcli.errors import Interrupted, UsageError
from dsparkcli.llama.speculation import DSPARK, PLAIN

if TYPE_CHECKING:
    from rich.table import Table

    from dsparkcli.budget.record import TuningRecord

# `dspark tune --help` builds only the options: the tuning run, the cost model, the store and the engine's
# modules load when a tuning runs (tests/test_startup.py bounds each command's start-up)

HELP = """Choose --budget (and --p-min) for a pair on this machine from a measured cost model.

Measures plain decoding (t1) and, per candidate budget k, a draft step with nothing accepted
(--spec-synth-len 1 cells: t_step(k)); then the pair's per-position acceptance at the largest budget
on your prompts, per category (and per --p-min when the draft has a confidence head); predicts the
speedup of every (k, p-min) as tau*t1/(t_step(k) + (tau-1)*s) (s fitted on the p-min 0 cells; each
p-min's own cost fitted on its cells), and measures the best candidates next to plain decoding in the
same run, predicted vs measured per cell: when any is more than 10 % off, the rest of the grid is
measured too and the pick is the best measured cell. The choice is stored per category for this
target and draft (sha256), engine commit, backend, GPU and the settings that change speed (--threads,
--parallel, placement, -ngl -ngld -fa -ctk -ctv -b -ub after --; not --ctx): `run`, `serve` and `bench`
use it with --budget auto or adaptive. Tuning another --category keeps the stored ones. Arguments after
`--` go to llama-server (and into the key).

\b
Examples:
  dspark tune --model minicpm-v-4.7 -- -ngl 99 -ngld 99 -fa on
  dspark tune --target t.gguf --draft d.gguf --category text --budgets 3 5 7 --json
  dspark tune --model minicpm-v-4.7 --apply          # also write the budget into your models.toml
  dspark tune --target t.gguf --draft d.gguf --prompts my.jsonl --max-minutes 10
  dspark tune --target t.gguf --draft d.gguf --synth-len 5.1 --category text   # SYNTHETIC acceptance
  dspark tune --target t.gguf --draft d.gguf --cost-table cost.txt   # per-k step costs, for llama.cpp
  dspark tune --target t.gguf --draft d.gguf --adaptive   # static picks vs llama.cpp's per-step budget
  dspark bench --target t.gguf --draft d.gguf --budget 3 5 adaptive  # then compare them on any kit
  dspark run photo.png "Describe" --budget auto      # then use it
"""


class TuneCommand(TyperCommand):
    """``--budgets 3 5 7`` and ``--p-min 0 0.5`` take several values."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = expand_multi_values(args, ("--budgets", "--p-min"), _is_number)
        return super().parse_args(ctx, expand_multi_values(args, ("--methods",), _is_method))


def _is_method(text: str) -> bool:
    return not text.startswith("-")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return not text.startswith("--")


def _phase_line(rec: TuningRecord) -> str:
    t = rec.timings_s
    cost = "reused from the stored tuning" if t.get("cost_reused") else f"{t.get('cost', 0):.1f} s"
    return (
        f"tuned in {t.get('total', 0):.1f} s: cost model {cost}, acceptance {t.get('acceptance', 0):.1f} s, "
        f"verification {t.get('verify', 0):.1f} s" + (" (cut by --max-minutes)" if t.get("verify_cut") else "")
    )


def overall_line(rec: TuningRecord) -> str | None:
    """What `--budget auto` runs overall, in one line: tune's method pick where it measured methods and one
    other than the DSpark draft won (run and serve follow it: budget.choice), else the DSpark budget (or plain
    decoding, when nothing beat it); None without an overall choice."""
    from dsparkcli.budget.model import OVERALL

    overall = rec.choice()
    method = rec.method_choice()
    if method is not None and method not in (PLAIN, DSPARK):
        speed = {m: x for c, m, x in rec.methods if c == OVERALL}
        drafted = "" if "+" in method else ", without the DSpark draft"
        return f"overall choice: {method} ({speed.get(method, 1.0):.2f}x plain); --budget auto runs it{drafted}"
    if method == PLAIN or (overall is not None and overall.candidate is None):
        return "nothing beat plain decoding on this machine and workload: --budget auto runs without the draft"
    if overall is None or overall.candidate is None:
        return None
    c = overall.candidate
    return (
        f"overall choice: budget {c.budget}"
        + (f", p-min {c.p_min:g}" if c.p_min else "")
        + "; use it with --budget auto"
        + (" --p-min auto" if c.p_min else "")
    )


def render(rec: TuningRecord) -> Table:
    from rich.table import Table

    from dsparkcli.budget import model as cost_model

    table = Table(
        title=("SYNTHETIC acceptance: " if rec.synthetic else "") + f"tuning {rec.key.id}",
        title_style="bold red" if rec.synthetic else "bold",
    )
    for col in (
        "category",
        "mean len @k_max",
        "best predicted",
        "candidate",
        "predicted",
        "measured",
        "off",
        "choice",
    ):
        table.add_column(
            col, justify="left" if col in ("category", "candidate", "choice", "best predicted") else "right"
        )
    acc = {(a.category, a.p_min): a for a in rec.acceptance}
    verified = {(c, lb): s for c, lb, s in rec.verified}
    preds = {(p.category, p.candidate.label): p.speedup for p in rec.predictions}
    for choice in rec.choices:
        cat = choice.category
        if cat == cost_model.OVERALL and rec.acceptance:
            p0 = min(a.p_min for a in rec.acceptance)
            a = cost_model.pooled([x for x in rec.acceptance if x.p_min == p0])
        else:
            a = acc.get((cat, 0.0)) or next((v for (c, _), v in acc.items() if c == cat), None)
        mean = f"{a.counters.mean_length:.2f}" if a and a.counters.mean_length else "–"
        best = cost_model.ranked(rec.predictions, cat)
        best_txt = f"{best[0].candidate.label} {best[0].speedup:.2f}x" if best else "–"
        labels = [lb for c, lb in verified if c == cat] or [best_txt.split()[0]]
        pick = choice.candidate.label if choice.candidate else "plain (no draft)"
        for i, lb in enumerate(labels):
            p, m = preds.get((cat, lb)), verified.get((cat, lb))
            off = f"{100 * (m / p - 1):+.0f} %" if p and m is not None else "–"
            table.add_row(
                cat if i == 0 else "",
                mean if i == 0 else "",
                best_txt if i == 0 else "",
                lb,
                f"{p:.2f}x" if p is not None else "–",
                f"{m:.2f}x" if m is not None else "–",
                off,
                pick if i == 0 else "",
                style="bold" if cat == cost_model.OVERALL else None,
            )
        table.add_section()
    return table


def tune_cmd(
    model: ModelOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    mmproj: MmprojOpt = None,
    prompts: PromptsOpt = kit.DEFAULT_KIT,
    category: CategoriesOpt = None,
    limit: LimitOpt = 3,
    budgets: Annotated[
        Optional[list[int]],
        typer.Option("--budgets", help="Candidate budgets (default 1 2 3 5 7 10 15, up to the draft's block)."),
    ] = None,
    p_min: PMinsOpt = None,
    n_predict: NPredictOpt = 128,
    reps: RepsOpt = 1,
    warmup: WarmupOpt = 1,
    top: Annotated[int, typer.Option("--top", min=1, help="Best predicted candidates per category to measure.")] = 2,
    ctx: CtxOpt = None,
    threads: ThreadsOpt = None,
    synth_len: SynthLenOpt = None,
    methods: MethodsOpt = None,
    synth_mode: Annotated[
        str,
        typer.Option(
            "--synth-mode", help="rates: smaller budgets keep the per-position rates; length: L at every budget."
        ),
    ] = "rates",
    max_minutes: Annotated[
        Optional[float],
        typer.Option(
            "--max-minutes", min=0.1, help="Stop starting cells after N minutes (verification is cut first)."
        ),
    ] = None,
    reuse_cost: Annotated[
        bool, typer.Option("--reuse-cost/--remeasure-cost", help="Reuse the stored cost model of the same key.")
    ] = True,
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the overall choice into your models.toml (needs --model).")
    ] = False,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Bench records (JSONL) here (default: the dspark cache).")
    ] = None,
    record_path: Annotated[
        Optional[Path], typer.Option("--record", help="Also write the tuning record (JSON) here.")
    ] = None,
    cost_table: Annotated[
        Optional[Path], typer.Option("--cost-table", help="Write the per-k step-cost table here.")
    ] = None,
    adaptive: Annotated[
        bool,
        typer.Option(
            "--adaptive",
            help="Also measure llama.cpp's adaptive budget (--budget adaptive: each step's budget from this cost model) next to the picks (dspark's patched engine).",
        ),
    ] = False,
    seed: SeedOpt = SEED,
    ignore_eos: IgnoreEosOpt = False,
    yes: YesOpt = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    from dsparkcli.bench import plan as bench_plan
    from dsparkcli.bench import tuning
    from dsparkcli.budget import methods as tune_methods
    from dsparkcli.budget import model as cost_model
    from dsparkcli.budget import store
    from dsparkcli.budget.apply import apply_to_models
    from dsparkcli.budget.choice import require_adaptive
    from dsparkcli.llama import engine as engine_mod

    t0 = time.monotonic()
    if apply and model is None:
        raise UsageError("--apply writes a models.toml override for a registry pair: give --model NAME")
    # refused before anything runs; with --synth-len only plain and dspark can be measured (emulated drafts)
    method_labels = tune_methods.parse_methods(methods or (None if synth_len is None else ["plain", "dspark"]))
    selected = kit.select(kit.load_prompts(prompts), category, limit)
    eng = engine_mod.describe(engine_mod.resolve_engine(llama_bin))
    engine_mod.require_dspark(eng)
    if adaptive:
        require_adaptive(eng)
    inputs = bench_plan.resolve_inputs(
        model=model,
        target=target,
        drafts=[draft] if draft else [],
        mmproj=mmproj,
        yes=yes,
        engine=eng,
        on_notice=lambda m: err.print(m, markup=False),
    )
    draft_path = inputs.drafts[0].path
    limit, has_conf = tuning.draft_limits(draft_path)
    for b in budgets or ():  # budget.limits: the one check, as run, serve and bench make it
        limit.check(b, "--budgets")
    cands = tuple(budgets or [b for b in tuning.DEFAULT_BUDGETS if limit.most is None or b <= limit.most])
    p_mins = tuple(p_min if p_min is not None else ([0.0, 0.3, 0.6] if has_conf and synth_len is None else [0.0]))
    if any(p > 0 for p in p_mins) and not has_conf:
        raise UsageError("--p-min > 0 needs a draft with a confidence head (this one has none)")
    tp = tuning.TunePlan(
        target=inputs.target,
        draft=draft_path,
        mmproj=inputs.mmproj,
        prompts=selected,
        budgets=cands,
        p_mins=p_mins,
        reps=reps,
        warmup=warmup,
        n_predict=n_predict,
        ctx=ctx,
        threads=threads,
        extra_args=passthrough_args(),
        top=top,
        synth_len=synth_len,
        synth_mode=synth_mode,
        seed=seed,
        ignore_eos=ignore_eos,
        reuse_cost=reuse_cost,
        model_name=inputs.model_name,
        deadline=t0 + 60.0 * max_minutes if max_minutes else None,
        upstream_acceptance=inputs.upstream_acceptance,
        methods=method_labels,
        scripted=inputs.scripted,
        adaptive=adaptive,
    )
    tp.validate()
    if synth_len is not None:
        err.print(
            f"[bold red]SYNTHETIC acceptance (L {synth_len:g} at budget {tp.k_max}, mode {synth_mode}): "
            "the choice emulates a draft[/bold red]"
        )
    elif tp.scripted:
        err.print(f"[bold red]SYNTHETIC acceptance ({tp.scripted}): a scripted pair, not a real draft[/bold red]")
    # deferred: rich.progress costs ~30 ms that `dspark --help` would pay at start-up
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[where]}"),
    )
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        tasks: dict[str, int] = {}

        def on_progress(p: tuning.Progress) -> None:
            if p.phase not in tasks:
                tasks[p.phase] = progress.add_task(p.phase, total=p.total, where="")
            progress.update(tasks[p.phase], completed=p.done, total=p.total, where=p.arm)

        try:
            rec = tuning.run_tune(eng, tp, out=out_path, argv=sys.argv, on_progress=on_progress)
        except KeyboardInterrupt:
            raise Interrupted(
                "interrupted: what was measured is kept (bench records and a partial tuning record "
                "next to them, under the dspark cache or --out)"
            ) from None
    saved = store.store_dir() / f"{rec.key.id}.json"
    kept = [c for c in (store.find(rec.key) or rec).tuned_categories if c not in rec.tuned_categories]
    if record_path is not None:
        store.write(rec, record_path)
    if cost_table is not None:
        cost_table.write_text(cost_model.cost_table(rec.cost), encoding="utf-8")
    applied = None
    overall = rec.choice()
    if apply:
        assert model is not None and overall is not None
        applied = apply_to_models(model, overall, rec.key.id)
    missed = cost_model.misses(rec.predictions, rec.verified)
    if json_out:
        print_json(
            {
                **rec.to_record(),
                "stored": str(saved),
                "applied": str(applied) if applied else None,
                "kept_categories": kept,
                "off": [
                    {"category": m.category, "candidate": m.label, "predicted": m.predicted, "measured": m.measured}
                    for m in missed
                ],
            }
        )
        return
    out.print(render(rec))
    c = rec.cost
    steps = ", ".join(f"k={k} {ms:.3g}" for k, ms in c.t_step_ms)
    extra = "".join(
        f"; p-min {p:g} +{ms:.3g} ms per block position a round"
        if ms >= 0
        else f"; p-min {p:g} {ms:.3g} ms per block position a round"
        for p, ms in c.p_min_ms
    )
    err.print(
        f"cost model: t1 {c.t1_ms:.3g} ms/token; t_step(k) ms: {steps}; s {c.s_ms:.3g} ms per accepted token{extra}",
        markup=False,
    )
    if missed:
        w = missed[0]
        rest = int(rec.timings_s.get("verify_rest", 0))
        err.print(
            f"the model is more than 10 % off on {len(missed)} verified cell{'s' if len(missed) > 1 else ''} "
            f"(worst: {w.category} {w.label}, predicted {w.predicted:.2f}x, measured {w.measured:.2f}x): the "
            "pick is the best measured cell" + (f", with the {rest} other candidates measured too" if rest else ""),
            markup=False,
        )
    err.print(_phase_line(rec), markup=False)
    if rec.method_choices:  # one line: what --budget auto runs per category, from the same verification run
        speed = {(c, m): x for c, m, x in rec.methods}
        err.print(
            "methods (--budget auto runs the pick): "
            + "; ".join(f"{c} {m} {speed[(c, m)]:.2f}x" for c, m in rec.method_choices),
            markup=False,
        )
    line = overall_line(rec)
    if line:
        err.print(line, markup=False)
    err.print(
        f"stored: {saved}"
        + (f" (kept its tuning of {', '.join(kept)})" if kept else "")
        + f"; records: {rec.jsonl}"
        + (f"; applied to {applied}" if applied else ""),
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("tune", help=HELP, cls=TuneCommand)(tune_cmd)
