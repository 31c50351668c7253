#!/usr/bin/env python3
"""The BENCHMARKS.md table "where a step's milliseconds go" from study/gpu_profile.py's records:

    python -m study.profile_to_md gpu-out/profile-standin.jsonl

Per configuration: llama-server's step time (timing run, no profiler), the kernels' GPU time per step by
kind (ncu window, cut to whole steps), the rest of the step (host work and GPU idle at syncs), and both per
emitted token. Rows are rebuilt from the raw records by study.kernel_profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from study import kernel_profile as profile


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def table(records: list[dict[str, Any]], *, min_match: float = 1.0) -> str:
    rows = profile.rows_from_records(records, min_match=min_match)
    synth = sorted({r["synth_len"] for r in records if r.get("record") == "timing" and r.get("synthetic")})
    title = (
        "SYNTHETIC acceptance (--spec-synth-len " + ", ".join(f"{x:g}" for x in synth) + "): speeds emulate "
        "a draft, outputs are not valid"
        if synth
        else "acceptance as the pair gives it"
    )
    head = [
        "config",
        "t_step ms",
        "tok/step",
        "draft ms (server)",
        "kernels ms",
        *(profile.KIND_LABELS[k] for k in profile.KINDS),
        "host + sync gap ms",
        "kernels/step",
        "ms/token",
        "kernel ms/token",
    ]
    lines = [
        f"**Where a step's milliseconds go: llama-server's step time (no profiler) vs the GPU time of its "
        f"kernels per step (ncu), ms. {title}**",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        kinds = [_f(r["by_kind_ms"][k], 3) if r["by_kind_ms"] else "–" for k in profile.KINDS]
        cells = [
            r["config"],
            _f(r["t_step_ms"], 3),
            _f(r["tokens_per_step"]),
            _f(r["t_draft_ms"], 3),
            _f(r["kernel_ms"], 3),
            *kinds,
            _f(r["gap_ms"], 3),
            str(r["kernels_per_step"] or "–"),
            _f(r["ms_per_token"], 3),
            _f(r["kernel_ms_per_token"], 3),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    unsteady = [
        r["config"]
        for r in rows
        if r["kernel_ms"] is None
        and any(x.get("record") == "kernels" and x.get("config") == r["config"] for x in records)
    ]
    errors = [r for r in records if r.get("record") == "error"]
    lines.append("")
    lines.append(
        "mul_mat_id's expert matmuls run in the MMQ/MMVQ kernels and count as matmul; the MoE column is "
        "the routing, id and gather kernels around them. Gap: t_step minus kernel time (host-side "
        "sampling, graph build and launch, and the GPU idle at synchronisations). t_step: the timed "
        "request of median step time; draft ms: the draft's time per call from llama-server's "
        "draft-dspark statistics (its kernels are inside the kernel columns too)."
    )
    if min_match < 1.0:
        lines.append(f"Step period read with {min_match:g} of consecutive steps' launches matching (--min-match).")
    if unsteady:
        lines.append(
            f"Not periodic (window straddles a phase; rerun with another --skip/--count): {', '.join(unsteady)}."
        )
    for e in errors:
        lines.append(f"error: {e['config']} {e.get('phase', '')}: {e['error'][:200]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument(
        "--min-match",
        type=float,
        default=1.0,
        help="fraction of launches one step apart that must match for the window to count as periodic",
    )
    args = ap.parse_args(argv)
    records = [json.loads(ln) for p in args.records for ln in p.read_text().splitlines() if ln.strip()]
    sys.stdout.write(table(records, min_match=args.min_match))
    return 0


if __name__ == "__main__":
    sys.exit(main())
