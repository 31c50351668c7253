"""BENCHMARKS.md stays traceable: its generated section is exactly what study/bench_to_md.py makes of the
committed records, and the hand-written headline table quotes those generated cells."""

from __future__ import annotations

import re
from pathlib import Path

from support.scripts import script

ROOT = Path(__file__).resolve().parent.parent
RECORDS = [
    ROOT / "study/results/h200/study/sweep.jsonl",
    *sorted((ROOT / "study/results/h200/study2").glob("sweep-*.jsonl")),
    ROOT / "study/results/h200/study2/replicate-4.jsonl",
]


def _generated_and_doc() -> tuple[str, str]:
    bench_to_md = script("bench_to_md")
    return bench_to_md.render(bench_to_md.load(RECORDS)), (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")


def test_generated_section_is_the_records_rendered() -> None:
    generated, doc = _generated_and_doc()
    assert len(RECORDS) == 5 and all(p.is_file() for p in RECORDS)
    body = doc.split("<summary>Generated tables (study/bench_to_md.py, unedited)</summary>\n\n", 1)[1]
    assert body.split("\n</details>", 1)[0] == generated


def test_headline_budgets_quote_the_generated_best_budget_rows() -> None:
    generated, doc = _generated_and_doc()
    best_256 = generated.split("#### Best budget per upstream category (n_predict 256)", 1)[1].split("####", 1)[0]
    rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| \*\*(\d+)\*\* \| ([\d.]+× \[[\d.–]+\]) \|", doc, re.M)
    assert [r[0] for r in rows] == ["general", "mmmu", "ocr", "charxiv", "mathvista", "math", "code"]
    for category, L, k, speedup in rows:
        assert f"| {category} | {L} | {k} | {speedup} |" in best_256


def test_real_section_is_the_real_records_rendered() -> None:
    real_to_md = script("real_to_md")
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    body = doc.split("<summary>Generated tables (study/real_to_md.py, unedited)</summary>\n\n", 1)[1]
    generated = body.split("\n</details>", 1)[0]
    assert generated == real_to_md.render()
    assert "REAL acceptance: a real draft on a real target" in generated and "SYNTHETIC" not in generated


def test_real_headline_quotes_the_h200_records() -> None:
    """The REAL headline (fastest budget per category, its speedup and acceptance, the best acceptance
    anywhere) is recomputed here from the committed H200 records by bench.stats."""
    from dsparkcli.bench import stats
    from dsparkcli.bench.records import read_jsonl

    rows = [
        s.to_record()  # the figures as the JSONL and --json give them
        for s in stats.summarize(read_jsonl(ROOT / "study/results/h200/real3/bench-h200.jsonl"))
        if s.config != "plain" and s.category != "all"
    ]
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    for cat in ("math", "code", "general"):
        mine = [s for s in rows if s["category"] == cat]
        fast = max(mine, key=lambda s: s["speedup"])
        most = max(mine, key=lambda s: s["mean_length"])
        line = (
            f"| {cat} | {fast['budget']} | {fast['speedup']:.2f}× | {fast['mean_length']:.2f} | "
            f"{most['mean_length']:.2f} ({most['budget']}) |"
        )
        assert line in doc, line
        assert fast["speedup"] < 1.0  # the headline says: slower than plain at every budget
    assert all(s["speedup"] < 1.0 for s in rows)


def test_adaptive_section_is_its_records_rendered() -> None:
    adaptive_to_md = script("adaptive_to_md")
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    body = doc.split("<summary>Generated tables (study/adaptive_to_md.py, unedited)</summary>\n\n", 1)[1]
    generated = adaptive_to_md.render(ROOT / "study/results/cpu/adaptive-smollm2-135m")
    assert body.split("\n\n</details>", 1)[0] == generated
    assert "@adaptive | all |" in generated and "| adaptive |" in generated
    h200 = doc.split(
        "<summary>Generated tables (study/adaptive_to_md.py on study/results/h200/adaptive-real, unedited)</summary>\n\n",
        1,
    )[1]
    generated = adaptive_to_md.render(ROOT / "study/results/h200/adaptive-real")
    assert h200.split("\n\n</details>", 1)[0] == generated.rstrip("\n")
    assert "GPU NVIDIA H200" in generated and "@adaptive | all |" in generated
    third = doc.split(
        "<summary>Generated tables (study/adaptive_to_md.py on study/results/cpu/adaptive-smollm2-135m-3, "
        "unedited)</summary>\n\n",
        1,
    )[1]
    generated = adaptive_to_md.render(ROOT / "study/results/cpu/adaptive-smollm2-135m-3")
    assert third.split("\n\n</details>", 1)[0] == generated.rstrip("\n")
    assert "engine 0c1e570 cpu" in generated and "@adaptive | all |" in generated


def test_session36_section_is_its_records_rendered() -> None:
    """The H200 run of session 36 (issues 30 and 32): the generated tables are exactly what
    study/session36_to_md.py makes of study/results/h200/session36, and the prose quotes them."""
    session36 = script("session36_to_md")
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    body = doc.split("<summary>Generated tables (study/session36_to_md.py, unedited)</summary>\n\n", 1)[1]
    generated = session36.render()
    assert body.split("\n</details>", 1)[0] == generated
    stock = next(line for line in generated.splitlines() if line.startswith("| stock key | 1.403"))
    assert stock.endswith("| 1.74 | 1.99 | 2.43 | 2.84 |")  # t_step(k) / t1 quoted in the prose
    assert "t_step(1) / t1 = 1.74 and t_step(3) / t1 = 1.99" in doc
    assert "| code | 724 (665-783) |" in generated and "1.09× (2.34)" in generated
