"""Bench's output formats stay byte for byte what they were: the summary JSONL lines, Markdown, CSV, the --json
document and the terminal table of a fixed set of records (tests/data/bench_report/records.jsonl: a real run with
divergences, an interrupted block and an n-gram draft; a synthetic run; a drafts-only run; a --concurrency run of
a scripted pair). The expected files were rendered by dspark at 71f7234, before summaries were typed (issue 29):
users' files and the BENCHMARKS.md renderers read these formats."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from dsparkcli.bench import report, stats
from dsparkcli.bench.records import dumps, read_jsonl
from dsparkcli.cli._output import to_json
from dsparkcli.cli.bench import render_table

DATA = Path(__file__).parent / "data" / "bench_report"
RUNS = {"golden-real": {"code": 3.1}, "golden-synth": {}, "golden-load": {}, "golden-noplain": {"chat": 2.5}}
OVERHEAD = {
    "wall_s": 12.5,
    "generation_s": 10.0,
    "load_s": 1.5,
    "request_s": 10.25,
    "provenance_s": 0.25,
    "stop_s": 0.125,
    "ratio": 1.0869565217391304,
    "ratio_after_hashing": 1.0652173913043479,
}


def _expected(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def _rows(run_id: str) -> list[dict]:
    records = read_jsonl(DATA / "records.jsonl", run_id)
    prov = records[0]["provenance"]
    return [{**r, "run_id": run_id, "provenance": prov} for r in stats.summarize(records, RUNS[run_id])]


@pytest.mark.parametrize("run_id", RUNS)
def test_summary_lines_are_unchanged(run_id):
    assert "".join(dumps(r) + "\n" for r in _rows(run_id)) == _expected(f"{run_id}.summaries.jsonl")


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("run_id", RUNS)
def test_markdown_json_and_table_are_unchanged(run_id, partial):
    rows, tag = _rows(run_id), ".partial" if partial else ""
    assert report.to_markdown(rows, partial=partial) == _expected(f"{run_id}{tag}.md")
    doc = report.to_json_doc(
        rows, run_id=run_id, out=Path("bench.jsonl"), overhead={} if partial else OVERHEAD, partial=partial
    )
    assert to_json(doc) + "\n" == _expected(f"{run_id}{tag}.json")
    console = Console(file=io.StringIO(), width=240, record=True, color_system=None)
    console.print(render_table(rows, partial=partial))
    assert console.export_text() == _expected(f"{run_id}{tag}.table.txt")


@pytest.mark.parametrize("run_id", RUNS)
def test_csv_is_unchanged(run_id):
    assert report.to_csv(_rows(run_id)) == _expected(f"{run_id}.csv")
