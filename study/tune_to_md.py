"""Markdown for BENCHMARKS.md from `dspark tune`'s outputs: a tuning record (predicted vs measured per
category, the cost model) or study/tune_study.py's summary (tune's pick vs the grid per L).

  python -m study.tune_to_md tune.json                  # a tuning record (dspark tune --record / --json)
  python -m study.tune_to_md study/tune-study.json      # the study summary
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsparkcli.budget.model import ranked
from dsparkcli.budget.record import TuningRecord


def record_md(rec: TuningRecord, source: str) -> str:
    c = rec.cost
    steps = " · ".join(f"k={k}: {ms:.3g}" for k, ms in c.t_step_ms)
    lines = [
        f"Tuning `{rec.key.id}` ({'SYNTHETIC' if rec.synthetic else 'REAL'} acceptance; engine "
        f"{rec.key.engine_commit} {rec.key.backend}, GPU {rec.key.gpu}, flags "
        f"{' '.join(f'{k}={v}' for k, v in rec.key.flags) or 'none'}; `{source}`). Cost model: t1 "
        f"{c.t1_ms:.3g} ms/token; t_step(k) ms {steps}; s {c.s_ms:.3g} ms. Tuned in "
        f"{rec.timings_s.get('total', 0):.1f} s (cost {rec.timings_s.get('cost', 0):.1f}, acceptance "
        f"{rec.timings_s.get('acceptance', 0):.1f}, verification {rec.timings_s.get('verify', 0):.1f}).",
        "",
        "| category | mean length at k_max | best predicted | candidate | predicted | measured | choice |",
        "|---|---|---|---|---|---|---|",
    ]
    acc = {a.category: a for a in rec.acceptance if a.p_min == 0.0}
    preds = {(p.category, p.candidate.label): p.speedup for p in rec.predictions}
    for ch in rec.choices:
        cat = ch.category
        mean = acc[cat].counters.mean_length if cat in acc and acc[cat].counters.mean_length else None
        best = ranked(rec.predictions, cat)
        pick = ch.candidate.label if ch.candidate else "plain"
        for i, (_vc, lb, m) in enumerate([v for v in rec.verified if v[0] == cat] or [(cat, "–", None)]):
            p = preds.get((cat, lb))
            lines.append(
                f"| {cat if i == 0 else ''} | {f'{mean:.2f}' if mean and i == 0 else ''} | "
                f"{f'{best[0].candidate.label} {best[0].speedup:.2f}×' if best and i == 0 else ''} | {lb} | "
                f"{f'{p:.2f}×' if p is not None else '–'} | {f'{m:.2f}×' if m is not None else '–'} | "
                f"{f'**{pick}**' if i == 0 else ''} |"
            )
    return "\n".join(lines) + "\n"


def study_md(doc: dict, source: str) -> str:
    lines = [
        f"`{source}`: mode {doc['mode']}, tune {doc['reps']} rep(s) × {doc['n_predict']} tokens, grid "
        f"{doc.get('grid_reps')} reps × {doc.get('grid_n_predict')} tokens, budgets {doc['budgets']}.",
        "",
        "| category | L | tune's pick | its speedup in the grid | grid best | vs grid best | vs k=5 | tune s | grid s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x, fmt="{:.2f}"):
        return fmt.format(x) if isinstance(x, (int, float)) else "–"

    for r in doc["rows"]:
        pick = "plain" if r.get("tune_pick") is None else f"k={r['tune_pick']}"
        best = "plain" if r.get("grid_best") is None else f"k={r['grid_best']}"
        lines.append(
            f"| {r.get('category') or ''} | {r['L']:g} | {pick} | {f(r.get('pick_in_grid'))}× | {best} "
            f"{f(r.get('grid_best_speedup'))}× | {f(r.get('pick_vs_best'))} | {f(r.get('pick_vs_k5'))} | "
            f"{f(r.get('tune_wall_s'), '{:.0f}')} | {f(r.get('grid_wall_s'), '{:.0f}')} |"
        )
    lines += [
        "",
        f"Tune {f(doc['tune_wall_s'], '{:.0f}')} s against the grid's {f(doc['grid_wall_s'], '{:.0f}')} s "
        f"({f(doc['tune_over_grid_wall'])}); pick vs grid best ≥ {f(doc['min_pick_vs_best'])}; mean pick vs k=5 "
        f"{f(doc['mean_pick_vs_k5'])}; lowest pick speedup {f(doc['min_pick_in_grid'])}×.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    for arg in sys.argv[1:]:
        doc = json.loads(Path(arg).read_text())
        sys.stdout.write(
            study_md(doc, arg) if doc.get("kind") == "tune-study" else record_md(TuningRecord.from_record(doc), arg)
        )
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
