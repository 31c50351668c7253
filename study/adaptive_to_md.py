#!/usr/bin/env python3
"""BENCHMARKS.md tables for the adaptive budget (issue 20), from an adaptive-real leg's folder
(study/plans/adaptive.toml; the former study/adaptive_real.sh):
the tuning record (static candidates and "adaptive" measured side by side, study/tune_to_md.py) and the
bench run (plain, fixed budgets and `<draft>@adaptive`, per category and all interleaved on one server).

    python -m study.adaptive_to_md study/results/cpu/adaptive-smollm2-135m > section.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsparkcli.bench import report, stats
from dsparkcli.bench.records import read_jsonl
from dsparkcli.budget.record import TuningRecord
from study import tune_to_md

ROOT = Path(__file__).resolve().parent.parent


def render(folder: Path) -> str:
    rec = TuningRecord.from_record(json.loads((folder / "tune.json").read_text(encoding="utf-8")))
    bench = stats.summarize(read_jsonl(folder / "bench.jsonl"))
    where = folder.resolve()
    name = str(where.relative_to(ROOT) if ROOT in where.parents else folder)  # the records as committed
    return (tune_to_md.record_md(rec, f"{name}/tune.json") + "\n\n" + report.to_markdown(bench)).rstrip("\n")


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["study/results/cpu/adaptive-smollm2-135m"]:
        print(render(Path(arg)))
