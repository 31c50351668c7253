"""`dspark distill TARGET.gguf OUT.gguf`: train a DSpark draft for a llama.cpp target."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsparkcli.cli._common import SEED, BlockSizeOpt, JsonOpt, LlamaBinOpt, SeedOpt
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.config import cache_dir
from dsparkcli.errors import UsageError
from dsparkcli.llama.engine import resolve_engine
from dsparkcli.outputs import check_output_dir, check_output_file

HELP = """Train a DSpark draft for a GGUF target (llama, qwen3) and write it as a GGUF llama.cpp serves.

The target itself writes the training data: greedy answers to thousands of varied prompts (code,
math, general) and to questions it writes itself; the bench kit is held out. The draft borrows the
target's embeddings and head, trains a Markov head and a confidence head (for --p-min), and is
checked against the engine's own graph by `make test`. Needs the training extra:
pip install 'dspark[train]'. A GPU is used when torch sees one; a CPU works for tiny targets.
Stages are kept in --work and a rerun of the same command resumes; the GGUF is written atomically.

\b
Examples:
  dspark distill smollm2.gguf smollm2-dspark.gguf --minutes 8
  dspark distill t.gguf d.gguf --layers 1 --block-size 4 --steps 200 --device cpu
  dspark distill t.gguf d.gguf --prompts my_prompts.txt --taps 2,15,28 --json
  dspark distill t.gguf d.gguf --prepare-only --work w/ --n-prompts 30000   # tokenise here, train on the GPU
"""


def _taps(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        taps = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UsageError(f"--taps takes comma-separated layer ids, got {text!r}") from None
    if not taps:
        raise UsageError("--taps is empty")
    return taps


def distill(
    target: Annotated[Path, typer.Argument(help="Target GGUF (llama or qwen3 arch).")],
    output: Annotated[Path, typer.Argument(help="Where to write the draft GGUF.")],
    minutes: Annotated[Optional[float], typer.Option("--minutes", min=0.05, help="Training time budget.")] = None,
    steps: Annotated[
        Optional[int], typer.Option("--steps", min=1, help="Training steps (with or instead of --minutes).")
    ] = None,
    layers: Annotated[int, typer.Option("--layers", min=1, max=8, help="Draft layers.")] = 2,
    block_size: BlockSizeOpt = 8,
    taps: Annotated[
        Optional[str], typer.Option("--taps", help="Target layer inputs to tap, e.g. 2,15,28 (default: 3 spread).")
    ] = None,
    markov_rank: Annotated[int, typer.Option("--markov-rank", min=1, help="Markov head rank R.")] = 64,
    seed: SeedOpt = SEED,  # prompts, data order and initialisation
    prompts: Annotated[
        Optional[Path],
        typer.Option("--prompts", help="Extra training prompts: text lines or JSONL {prompt, category}."),
    ] = None,
    n_prompts: Annotated[
        int, typer.Option("--n-prompts", min=0, help="Templated prompts from dspark's corpus.")
    ] = 6000,
    n_questions: Annotated[
        int, typer.Option("--n-questions", min=0, help="Questions the target writes itself.")
    ] = 3000,
    max_new: Annotated[int, typer.Option("--max-new", min=8, help="Tokens per training response.")] = 384,
    batch: Annotated[int, typer.Option("--batch", min=1, help="Sequences per training step.")] = 16,
    gen_batch: Annotated[
        int,
        typer.Option(
            "--gen-batch",
            min=1,
            help="Generation pool: sequences decoded together (a slot is refilled as soon as its answer ends).",
        ),
    ] = 256,
    data_minutes: Annotated[
        Optional[float],
        typer.Option(
            "--data-minutes",
            min=0.05,
            help="Stop starting new training answers after this long (those in flight finish; what is done is kept).",
        ),
    ] = None,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="Peak learning rate.")] = 1e-3,
    soft_weight: Annotated[
        float,
        typer.Option(
            "--soft-weight",
            min=0.0,
            max=1.0,
            help="Share of the soft loss (the target's top-8 distribution) in the token loss.",
        ),
    ] = 0.5,
    val_groups: Annotated[
        int,
        typer.Option(
            "--val-groups",
            min=0,
            help="Prompt templates per category held out whole for validation (0: a random split).",
        ),
    ] = 2,
    val_subjects: Annotated[
        float,
        typer.Option(
            "--val-subjects",
            min=0.0,
            max=0.5,
            help="Share of each category's template subjects (code tasks, topics) held out from training under every template (0: templates only).",
        ),
    ] = 0.1,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:N].")] = "auto",
    outtype: Annotated[str, typer.Option("--outtype", help="Weights in the GGUF: q8_0, f16 or f32.")] = "q8_0",
    work: Annotated[Optional[Path], typer.Option("--work", help="Work folder (default: dspark cache).")] = None,
    prepare_only: Annotated[
        bool,
        typer.Option(
            "--prepare-only",
            help="Only tokenise the prompts into --work (needs an engine), then stop: train elsewhere from that folder.",
        ),
    ] = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    if minutes is None and steps is None and not prepare_only:
        raise UsageError("say how long to train: --minutes N or --steps N")
    if not target.is_file():
        raise UsageError(f"target not found: {target}")
    out_path = check_output_file(output, what="draft output", inputs=(target,)).resolve()
    if prompts is not None and not prompts.is_file():
        raise UsageError(f"prompts file not found: {prompts}")
    if work is not None:
        check_output_dir(work, what="--work folder")
    try:  # torch is the optional training extra: deferred, so every other command works without it
        from dsparkcli.distill.pipeline import DistillPlan, run_distill
        from dsparkcli.distill.train import TrainOptions
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == "torch":
            raise UsageError("distill needs torch: pip install 'dspark[train]'") from None
        raise

    key = hashlib.sha256(str(target.resolve()).encode()).hexdigest()[:12]
    plan = DistillPlan(
        target=target,
        out=out_path,
        work=work or cache_dir() / "distill" / key,
        train=TrainOptions(
            layers=layers,
            block_size=block_size,
            taps=_taps(taps),
            markov_rank=markov_rank,
            minutes=minutes,
            steps=steps,
            seed=seed,
            batch=batch,
            lr=lr,
            soft_weight=soft_weight,
            val_groups=val_groups,
            val_subjects=val_subjects,
        ),
        n_prompts=n_prompts,
        n_meta=n_questions,
        max_new=max_new,
        gen_batch=gen_batch,
        data_minutes=data_minutes,
        device=device,
        outtype=outtype,
        prompts_file=prompts,
        prepare_only=prepare_only,
    )
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=json_out or not err.is_terminal,
    ) as bar:  # off a terminal: no bar, no stray newline
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int, info: dict) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total or None, info="")
            text = " ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items() if v is not None
            )
            bar.update(tasks[stage], completed=done, total=total or None, info=text)

        report = run_distill(plan, lambda: resolve_engine(llama_bin), on_progress)
    if json_out:
        print_json(report)
        return
    if prepare_only:
        out.print(
            f"prepared {report.data['prompts']:,} prompts and {report.data['meta_prompts']:,} question prompts "
            f"in {plan.work}; train with the same command and --work, without --prepare-only"
        )
        return
    best = report.training.get("best") or {}
    out.print(f"wrote {report.out} ({report.out_bytes:,} bytes, sha256 {report.out_sha256})")
    out.print(
        f"data: {report.data['sequences']} sequences, {report.data['response_tokens']:,} response tokens; "
        f"trained {report.training['steps']} steps in {report.training['seconds']:.0f} s on {report.device}"
    )
    for cat, tau in sorted((best.get("tau") or {}).items()):
        out.print(
            f"  held-out simulated acceptance length, {cat}: "
            + " ".join(f"k{k + 1} {t:.2f}" for k, t in enumerate(tau))
        )
    out.print(f"work folder: {plan.work} (a rerun resumes from it)")


def register(app: typer.Typer) -> None:
    app.command("distill", help=HELP)(distill)
