"""Bench's output formats stay byte for byte what they were: the summary JSONL lines, Markdown, CSV, the --json
document and the terminal table of a fixed set of records (tests/data/bench_report/records.jsonl: a real run with
divergences, an interrupted block and an n-gram draft; a synthetic run; a drafts-only run; a --concurrency run of
a scripted pair). The expected files were rendered by dspark as of 111651d, before summaries were typed (issue 29):
users' files and the BENCHMARKS.md renderers read these formats."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from dsparkcli.bench import report, stats
from dsparkcli.bench.records import dumps, read_jsonl
from dsparkcli.bench.summaries import Summary, written_summaries
from dsparkcli.cli._bench_output import render_table
from dsparkcli.cli._output import to_json

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


def _rows(run_id: str) -> tuple[list[Summary], dict]:
    """The typed rows of one run and its provenance block."""
    records = read_jsonl(DATA / "records.jsonl", run_id)
    return stats.summarize(records, RUNS[run_id]), records[0]["provenance"]


@pytest.mark.parametrize("run_id", RUNS)
def test_summary_lines_are_unchanged(run_id):
    """The lines bench writes: ``to_record()`` with the run's id and provenance (bench.writer)."""
    rows, prov = _rows(run_id)
    lines = "".join(dumps({**r.to_record(), "run_id": run_id, "provenance": prov}) + "\n" for r in rows)
    assert lines == _expected(f"{run_id}.summaries.jsonl")


@pytest.mark.parametrize("run_id", RUNS)
def test_written_rows_read_back_to_the_same_rows(run_id):
    """tune reads its phases' rows back from the JSONL: the same typed rows, field for field."""
    rows, _ = _rows(run_id)
    assert written_summaries(read_jsonl(DATA / f"{run_id}.summaries.jsonl")) == rows


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("run_id", RUNS)
def test_markdown_json_and_table_are_unchanged(run_id, partial):
    (rows, prov), tag = _rows(run_id), ".partial" if partial else ""
    assert report.to_markdown(rows, prov, partial=partial) == _expected(f"{run_id}{tag}.md")
    doc = report.to_json_doc(
        rows, prov, run_id=run_id, out=Path("bench.jsonl"), overhead={} if partial else OVERHEAD, partial=partial
    )
    assert to_json(doc) + "\n" == _expected(f"{run_id}{tag}.json")
    console = Console(file=io.StringIO(), width=240, record=True, color_system=None)
    console.print(render_table(rows, prov, partial=partial))
    assert console.export_text() == _expected(f"{run_id}{tag}.table.txt")


@pytest.mark.parametrize("run_id", RUNS)
def test_csv_is_unchanged(run_id):
    rows, _ = _rows(run_id)
    assert report.to_csv(rows) == _expected(f"{run_id}.csv")
