"""`dspark requant IN OUT`: requantise the DSpark heads with llama-quantize and verify every tensor."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dsparkcli import requant as core
from dsparkcli.cli._common import JsonOpt, LlamaBinOpt
from dsparkcli.cli._output import err, out, print_json
from dsparkcli.gguf.analysis import Census
from dsparkcli.llama.engine import resolve_engine

HELP = """Change the type of a draft's heads (markov_w1, markov_w2, fc) and nothing else, verified.

Writes a per-tensor type map (every tensor pinned to its current type, the heads to --heads,
--tensor overrides on top), runs the engine's llama-quantize with a quantised positional type
(COPY would silently ignore the map), then compares the sha256 of every tensor data region:
the planned tensors must have their new type and size, every other one must be byte-identical.
OUT is written to a temp file next to it and renamed only when that check passes; IN is never
overwritten. Refused up front: 1-D and norm tensors (llama-quantize keeps them), rows that are not
a multiple of the target block (it would silently fall back), requantising without
--allow-requantize.

\b
Examples:
  dspark requant draft-bf16.gguf draft-q8heads.gguf             # heads -> q8_0
  dspark requant draft-bf16.gguf draft-q6heads.gguf --heads q6_K
  dspark requant in.gguf out.gguf --tensor blk.0.attn_q.weight=q8_0 --dry-run
  dspark requant in.gguf out.gguf --json                        # plan, census, verification
"""


def _census_line(c: Census) -> str:
    parts = [f"{r.count} {r.type_name} ({r.n_bytes:,} B)" for r in c.rows]
    return " + ".join(parts)


def _plan_json(plan: core.Plan) -> dict[str, Any]:
    return {
        "input": plan.src,
        "output": plan.dst,
        "positional": plan.positional,
        "allow_requantize": plan.allow_requantize,
        "command": list(plan.command),
        "map_path": plan.map_path,
        "map": list(plan.map_lines),
        "tensors": plan.tensors,
        "changes": [t.name for t in plan.changes],
        "census_before": plan.census_before,
        "census_after_predicted": plan.census_after,
        "predicted_tensor_bytes": plan.predicted_tensor_bytes,
    }


def _print_plan(plan: core.Plan) -> None:
    out.print(f"plan: {plan.src} -> {plan.dst}")
    for t in plan.changes:
        out.print(
            f"  {t.name:<24} {list(t.shape)!s:<14} {t.current:>5} -> {t.target:<5} "
            f"{t.bytes_before:>12,} -> {t.bytes_after:,} B  ({t.why})"
        )
    out.print(f"  {len(plan.tensors) - len(plan.changes)} other tensor(s) pinned to their current type")
    out.print(f"census before: {_census_line(plan.census_before)}")
    out.print(f"census after:  {_census_line(plan.census_after)} (predicted)")
    out.print(f"type map ({len(plan.map_lines)} lines) goes to {plan.map_path} while llama-quantize runs")
    out.print(f"command: {shlex.join(plan.command)}")


def requant(
    src: Annotated[Path, typer.Argument(metavar="IN", help="Input GGUF (a DSpark draft).")],
    dst: Annotated[Path, typer.Argument(metavar="OUT", help="Output GGUF (never the input).")],
    heads: Annotated[
        str, typer.Option("--heads", help="Type for markov_w1, markov_w2 and fc: q8_0, q6_K or bf16.")
    ] = "q8_0",
    tensor: Annotated[
        Optional[list[str]],
        typer.Option("--tensor", metavar="NAME=TYPE", help="Per-tensor override, repeatable (e.g. fc.weight=bf16)."),
    ] = None,
    allow_requantize: Annotated[
        bool, typer.Option("--allow-requantize", help="Allow converting tensors that are already quantised.")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan and the exact llama-quantize command; run nothing.")
    ] = False,
    llama_bin: LlamaBinOpt = None,
    json_out: JsonOpt = False,
) -> None:
    # every input checked first (paths, types, the header): a typo is said before "no engine found"
    plan = core.build_plan(
        src, dst, heads=heads, overrides=tensor or (), allow_requantize=allow_requantize, force=force
    )
    quantize = resolve_engine(llama_bin).tool("llama-quantize")
    plan = replace(
        plan,
        command=core.quantize_command(
            quantize, plan.src, plan.partial_path, plan.map_path, plan.positional, plan.allow_requantize
        ),
    )
    if dry_run:
        if json_out:
            print_json({"dry_run": True, "plan": _plan_json(plan)})
        else:
            _print_plan(plan)
        return
    if not json_out:
        _print_plan(plan)
    result = core.execute(plan, on_step=None if json_out else (lambda msg: err.print(msg)))
    v = result.verification
    if json_out:
        print_json(
            {
                "dry_run": False,
                "plan": _plan_json(plan),
                "census_before": result.census_before,
                "census_after": result.census_after,
                "verification": v,
                "size_before": result.size_before,
                "size_after": result.size_after,
                "ratio": result.ratio,
                "quantize_seconds": result.quantize_seconds,
            }
        )
        return
    out.print(f"census after:  {_census_line(result.census_after)} (read back)")
    respelled = f", {len(v.respelled)} with a respelled shape" if v.respelled else ""
    out.print(
        f"verified: {len(v.changed)} changed as planned, {len(v.identical)} byte-identical{respelled} "
        f"(sha256 of every tensor data region); set {', '.join(f'{k}={val}' for k, val in v.kv_set.items())}"
    )
    for name, before, after in v.respelled:
        out.print(f"  {name}: shape {list(before)} written as {list(after)} (same bytes)")
    out.print(f"size: {result.size_before:,} -> {result.size_after:,} B ({result.ratio:.3f}x)  {plan.dst}")


def register(app: typer.Typer) -> None:
    app.command("requant", help=HELP)(requant)
