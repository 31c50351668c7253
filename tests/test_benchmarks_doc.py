"""BENCHMARKS.md stays traceable: its generated section is exactly what scripts/bench_to_md.py makes of the
committed records, and the hand-written headline table quotes those generated cells."""

from __future__ import annotations

import re
from pathlib import Path

from support.scripts import script

ROOT = Path(__file__).resolve().parent.parent
RECORDS = [ROOT / "results/h200/study/sweep.jsonl", *sorted((ROOT / "results/h200/study2").glob("sweep-*.jsonl")),
           ROOT / "results/h200/study2/replicate-4.jsonl"]


def _generated_and_doc() -> tuple[str, str]:
    bench_to_md = script("bench_to_md")
    return bench_to_md.render(bench_to_md.load(RECORDS)), (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_generated_section_is_the_records_rendered() -> None:
    generated, doc = _generated_and_doc()
    assert len(RECORDS) == 5 and all(p.is_file() for p in RECORDS)
    body = doc.split("<summary>Generated tables (scripts/bench_to_md.py, unedited)</summary>\n\n", 1)[1]
    assert body.split("\n</details>", 1)[0] == generated


def test_headline_budgets_quote_the_generated_best_budget_rows() -> None:
    generated, doc = _generated_and_doc()
    best_256 = generated.split("#### Best budget per upstream category (n_predict 256)", 1)[1].split("####", 1)[0]
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| \*\*(\d+)\*\* \| ([\d.]+× \[[\d.–]+\]) \|", doc, re.M)
    assert [r[0] for r in rows] == ["general", "mmmu", "ocr", "charxiv", "mathvista", "math", "code"]
    for category, L, k, speedup in rows:
        assert f"| {category} | {L} | {k} | {speedup} |" in best_256
