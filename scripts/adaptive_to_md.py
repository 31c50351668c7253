#!/usr/bin/env python3
"""BENCHMARKS.md tables for the adaptive budget (issue 20), from scripts/adaptive_real.sh's output folder:
the tuning record (static candidates and "adaptive" measured side by side, scripts/tune_to_md.py) and the
bench run (plain, fixed budgets and `<draft>@adaptive`, per category and all interleaved on one server).

    python scripts/adaptive_to_md.py results/cpu/adaptive-smollm2-135m > section.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts.tune_to_md

from dsparkcli.bench import report, stats  # noqa: E402
from dsparkcli.bench.records import read_jsonl  # noqa: E402
from dsparkcli.budget.record import TuningRecord  # noqa: E402
from scripts import tune_to_md  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def render(folder: Path) -> str:
    rec = TuningRecord.from_record(json.loads((folder / "tune.json").read_text(encoding="utf-8")))
    bench = stats.summarize(read_jsonl(folder / "bench.jsonl"))
    where = folder.resolve()
    name = str(where.relative_to(ROOT) if ROOT in where.parents else folder)  # the records as committed
    return (tune_to_md.record_md(rec, f"{name}/tune.json") + "\n\n" + report.to_markdown(bench)).rstrip("\n")


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["results/cpu/adaptive-smollm2-135m"]:
        print(render(Path(arg)))
