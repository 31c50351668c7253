"""BENCHMARKS.md's "What a user would pick instead" CPU section quotes its committed records: each row's median
tok/s, min-max over rounds, ratio to plain, drafted/accepted and identity are recomputed here from
study/results/cpu/peers-qwen/bench.jsonl by bench.stats (issue 34)."""

from __future__ import annotations

from pathlib import Path

from dsparkcli.bench import stats
from dsparkcli.bench.records import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "study/results/cpu/peers-qwen/bench.jsonl"


def row_line(s: dict) -> str:
    t = s["tok_s"]
    if s.get("drafted") is None:
        drafting = "- | - | -"
    else:
        rate = f"{100 * s['acceptance_rate']:.1f} %" if s.get("acceptance_rate") is not None else "-"
        drafting = f"{s['drafted']} / {s['accepted']} | {rate} | {s['identical']}/{s['prompts']}"
    return f"| {s['config']} | {t['median']:.1f} | {t['min']:.1f}-{t['max']:.1f} | {s['speedup']:.2f}x | {drafting} |"


def test_peers_section_quotes_the_records() -> None:
    rows = [s.to_record() for s in stats.summarize(read_jsonl(RECORDS)) if s.category == "all"]
    assert [s["config"] for s in rows] == ["plain", "ngram-mod", "draft-simple:qwen2.5-coder-0.5b@4"]
    section = (
        (ROOT / "BENCHMARKS.md")
        .read_text(encoding="utf-8")
        .split("## What a user would pick instead: n-gram and a classic draft model (CPU, REAL)", 1)[1]
    )
    for s in rows:
        assert row_line(s) in section, row_line(s)
    plain = rows[0]["tok_s"]
    noise = f"plain's rounds {plain['min']:.1f}-{plain['max']:.1f} tok/s (±{50 * (plain['max'] - plain['min']) / plain['median']:.0f} %)"
    assert noise in section, noise
