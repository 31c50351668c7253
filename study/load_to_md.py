#!/usr/bin/env python3
"""A BENCHMARKS.md section from `dspark bench --concurrency` records (load-*.jsonl of
study/plans/load.toml's legs; the former study/gpu_load.sh).

The rows are rebuilt from the request, counters and pass records (bench.stats.summarize), not copied
from the summary lines, so the section says exactly what the raw records say:

    python -m study.load_to_md study/results/h200/load-real.jsonl [study/results/h200/load-standin.jsonl ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsparkcli.bench import report, stats
from dsparkcli.bench.records import read_jsonl


def section(path: Path) -> str:
    records = read_jsonl(path)  # the file's last run
    if not records:
        raise SystemExit(f"load_to_md: no records in {path}")
    prov = records[0].get("provenance") or {}
    rows = stats.summarize(records)
    if not report.is_load(rows):
        raise SystemExit(f"load_to_md: {path} is not a --concurrency run")
    engine = prov.get("engine") or {}
    files = prov.get("files") or {}
    names = ", ".join(
        f"{role} `{Path(str(f.get('path', '?'))).name}` (sha256 `{str(f.get('sha256', ''))[:16]}…`)"
        for role, f in files.items()
        if f
    )
    head = (
        f"Run `{records[0].get('run_id')}` on {prov.get('gpu', '?')}, llama.cpp {engine.get('commit', '?')} "
        f"({engine.get('backend', '?')}); {names}; {prov.get('n_predict')} new tokens, {prov.get('reps')} passes "
        f"per cell, clients {prov.get('concurrency')}. Records: `{path}`."
    )
    return f"{head}\n\n{report.to_markdown(rows, prov)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("jsonl", nargs="+", type=Path)
    args = ap.parse_args(argv)
    sys.stdout.write("\n".join(section(p) for p in args.jsonl))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
