"""`dspark synth OUTDIR` writes a synthetic known-answer pair; `dspark synth-predict` predicts its output."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dsparkcli.cli._common import SEED, BlockSizeOpt, JsonOpt, NPredictOpt, PMinOpt, SeedOpt
from dsparkcli.cli._output import out, print_json
from dsparkcli.errors import UsageError
from dsparkcli.synth import full_width, minicpmv47
from dsparkcli.synth import known_answer as core

SYNTH_HELP = """Write a synthetic target/draft pair whose every draft outcome is known in advance.

The target (arch llama) always answers g(last token); the DSpark draft's Markov head proposes g too,
except on a chosen fraction of rows, so llama-server's draft_n / draft_n_accepted can be predicted
exactly (see `dspark synth-predict`). --shape writes a random-weight pair with a real model's shapes
for throughput work instead (acceptance emulated with --spec-synth-len). --shape minicpm-v-4.7 writes a
MiniCPM-V 4.7-shaped stand-in: qwen35moe target with rope.section_order, a minicpmv4_7 mmproj with
v.tok_embd_sep, and the DSpark draft (--width small for CPU tests, full for the real widths).

\b
Examples:
  dspark synth /tmp/pair                          # vocab 128, 100 % acceptance
  dspark synth /tmp/pair --accept-rate 0.7 --seed 1
  dspark synth /tmp/pair --confidence --vision    # + confidence head, mmproj and a PNG
  dspark synth /tmp/big --shape minicpm-v-4.7-35b-a3b --qtype Q8_0
  dspark synth /tmp/v47 --shape minicpm-v-4.7                     # small, loads on CPU in a second
  dspark synth /tmp/v47 --shape minicpm-v-4.7 --width full --rope-section-order tyxz
"""

PREDICT_HELP = """Predict the tokens and draft counters llama-server reports on a synthetic pair.

Greedy /completion with --prompt-tokens, or any request (chat, images) given the prompt's last
token with --last-token: the pair's output depends on the prompt only through that token.

\b
Examples:
  dspark synth-predict /tmp/pair/manifest.json --prompt-tokens 1,2,3
  dspark synth-predict /tmp/pair --last-token 17 --n-max 3 --n-predict 64 --json
  dspark synth-predict /tmp/pair --prompt-tokens 5 --n-max 8 --p-min 0.5
"""


def _parse_tokens(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise UsageError(f"--prompt-tokens takes comma-separated token ids, got {text!r}") from None
    if not tokens:
        raise UsageError("--prompt-tokens is empty")
    return tokens


def _write_shape(outdir: Path, shape: str, qtype: str, seed: int, json_out: bool, width: str, order: str) -> None:
    if shape == minicpmv47.SHAPE:
        result = minicpmv47.write_standin(outdir, scale=width, section_order=order, qtype=qtype, seed=seed)
    else:
        result = full_width.write_full_width(outdir, shape=shape, qtype=qtype, seed=seed)
    if json_out:
        print_json(result)
        return
    fields = dataclasses.asdict(result) if dataclasses.is_dataclass(result) else {"result": result}
    for key, value in fields.items():
        out.print(f"{key}: {value}")


def synth(
    outdir: Annotated[Path, typer.Argument(help="Directory to write the pair into (created if missing).")],
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary size (8..4096).")] = 128,
    accept_rate: Annotated[
        float, typer.Option("--accept-rate", "-q", help="Fraction of Markov rows that agree with the target (0..1).")
    ] = 1.0,
    confidence: Annotated[
        bool, typer.Option("--confidence", help="Add a scripted confidence head (for --spec-draft-p-min).")
    ] = False,
    vision: Annotated[bool, typer.Option("--vision", help="Also write a tiny mmproj (clip 'mlp') and a PNG.")] = False,
    seed: SeedOpt = SEED,  # g, the wrong rows and the confidences
    block_size: BlockSizeOpt = 8,
    shape: Annotated[
        Optional[str],
        typer.Option(
            "--shape",
            help="Random pair with a real model's shapes: minicpm-v-4.7-35b-a3b (full width, no mmproj) or "
            "minicpm-v-4.7 (the 4.7 format: target, minicpmv4_7 mmproj, draft).",
        ),
    ] = None,
    qtype: Annotated[str, typer.Option("--qtype", help="Tensor type for --shape (Q8_0, Q4_K).")] = "Q8_0",
    width: Annotated[
        str, typer.Option("--width", help="--shape minicpm-v-4.7: small (CPU tests) or full (the real widths).")
    ] = "small",
    rope_section_order: Annotated[
        str, typer.Option("--rope-section-order", help="--shape minicpm-v-4.7: zyxt or tyxz (M-RoPE stream order).")
    ] = "zyxt",
    json_out: JsonOpt = False,
) -> None:
    if shape is not None:
        _write_shape(outdir, shape, qtype, seed, json_out, width, rope_section_order)
        return
    pair = core.write_pair(
        outdir,
        vocab=vocab,
        accept_rate=accept_rate,
        confidence=confidence,
        vision=vision,
        seed=seed,
        block_size=block_size,
    )
    man = core.load_manifest(pair.manifest)
    if json_out:
        print_json(
            {
                "pair": pair,
                "vocab": man.vocab,
                "n_embd": man.n_embd,
                "block_size": man.block_size,
                "seed": man.seed,
                "accept_rate": man.accept_rate,
                "wrong_rows": len(man.wrong_rows),
                "correct_fraction": man.correct_fraction,
                "confidence": man.confidence,
                "files": man.files,
            }
        )
        return
    for role, rec in man.files.items():  # one line per file, never wrapped: paths stay copyable
        out.print(f"{role:<9} {pair.manifest.parent / rec['name']}  ({rec['bytes'] / 1024:.0f} KiB)")
    out.print(f"{'manifest':<9} {pair.manifest}")
    out.print(
        f"vocab {man.vocab}, block size {man.block_size}, {len(man.wrong_rows)} of {man.vocab} Markov rows wrong "
        f"({100 * man.correct_fraction:.1f} % right), confidence head {'yes' if man.confidence else 'no'}"
    )
    out.print(f"predict: dspark synth-predict {pair.manifest} --prompt-tokens 1,2,3 --n-max 7 --n-predict 32")


def synth_predict(
    manifest: Annotated[Path, typer.Argument(help="manifest.json of a synthetic pair (or its directory).")],
    prompt_tokens: Annotated[
        Optional[str], typer.Option("--prompt-tokens", help="Prompt token ids, comma-separated.")
    ] = None,
    last_token: Annotated[Optional[int], typer.Option("--last-token", help="Only the prompt's last token id.")] = None,
    n_max: Annotated[int, typer.Option("--n-max", help="--spec-draft-n-max of the server.")] = 7,
    n_predict: NPredictOpt = 32,
    p_min: PMinOpt = None,
    n_min: Annotated[int, typer.Option("--n-min", help="--spec-draft-n-min of the server.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    if (prompt_tokens is None) == (last_token is None):
        raise UsageError("give exactly one of --prompt-tokens and --last-token")
    man = core.load_manifest(manifest)
    if prompt_tokens is not None:
        pred = core.predict(
            man, _parse_tokens(prompt_tokens), n_max=n_max, n_predict=n_predict, p_min=p_min or 0.0, n_min=n_min
        )
    else:
        assert last_token is not None
        pred = core.predict_from_last(
            man, last_token, n_max=n_max, n_predict=n_predict, p_min=p_min or 0.0, n_min=n_min
        )
    if json_out:
        print_json(pred)
        return
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")  # long token lists wrap instead of being cut
    table.add_row("tokens", ",".join(map(str, pred.tokens)))
    table.add_row("text", pred.text)
    table.add_row("draft_n", str(pred.draft_n))
    table.add_row("draft_n_accepted", str(pred.draft_n_accepted))
    table.add_row("verification steps", str(pred.steps))
    table.add_row("mean len", f"{pred.mean_len:.2f}")
    table.add_row("accepted per pos", ",".join(map(str, pred.accepted_per_pos)))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("synth", help=SYNTH_HELP)(synth)
    app.command("synth-predict", help=PREDICT_HELP)(synth_predict)
