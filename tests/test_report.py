"""Rendering bench summaries: CSV, Markdown, table rows, the JSON document and the PNG plot."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

from PIL import Image

from dsparkcli.bench import report
from dsparkcli.bench.summaries import Divergence, DraftSummary, Spread, SummaryRecord
from dsparkcli.llama.protocol import SpecCounters

PROV = {"run_id": "r1", "synth_len": None}  # the run's provenance block


def drafting(drafted, accepted, steps, per_pos=(), *, identical=2, divergent=()):
    """A draft configuration's figures: per-position shares are accepted_per_pos / steps."""
    return DraftSummary(
        counters=SpecCounters(drafted, accepted, steps, tuple(per_pos)),
        timings_drafted=drafted,
        timings_accepted=accepted,
        identical=identical,
        prompts=2,
        divergent=tuple(divergent),
    )


def summary(config, category, median, lo, hi, speedup, *, synthetic=False, synth_len=None, draft=None):
    return SummaryRecord(
        config=config,
        category=category,
        draft=None if config == "plain" else "d",
        budget=None if config == "plain" else 5,
        synthetic=synthetic,
        synth_len=synth_len,
        prompts=2,
        reps=3,
        requests=6,
        tokens=600,
        tok_s=Spread(median, lo, hi),
        speedup=speedup,
        upstream_acceptance_length=None,
        drafting=draft,
    )


ROWS = [
    summary("plain", "ocr", 52.25, 50.0, 55.5, 1.0),
    summary(
        "q8@5",
        "ocr",
        104.5,
        99.0,
        110.0,
        2.0,
        draft=drafting(300, 240, 60, (60, 57, 51), identical=1, divergent=[Divergence("ocr-02", 41, "a", "b")]),
    ),
]


def test_table_rows_format_every_figure():
    plain, q8 = report.table_rows(ROWS)
    assert plain == ("plain", "ocr", "52.2", "50.0-55.5", "1.00x", "-", "-", "-", "-", "-", "-", "-", "-")
    assert q8 == (
        "q8@5",
        "ocr",
        "104",
        "99.0-110",
        "2.00x",
        "300",
        "240",
        "80.0%",
        "5.00",
        "-",
        "1/2",
        "ocr-02@41",
        "100 95 85",
    )
    assert len(report.COLUMNS) == len(q8)


def test_csv_has_one_row_per_summary_and_a_synthetic_column():
    text = report.to_csv(ROWS)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(report.CSV_FIELDS)
    assert [r["config"] for r in rows] == ["plain", "q8@5"]
    assert rows[1]["synthetic"] == "False" and rows[1]["speedup"] == "2.0" and rows[1]["mean_length"] == "5.0"
    assert rows[1]["first_divergences"] == "ocr-02@41"
    assert rows[1]["acceptance_per_pos"] == "1.0000 0.9500 0.8500"
    assert rows[0]["drafted"] == ""  # plain drafts nothing: empty, not 0


def test_synthetic_runs_are_labelled_everywhere(tmp_path):
    synth = [replace(r, synthetic=True, synth_len=None if r.config == "plain" else 3.0) for r in ROWS]
    label = "SYNTHETIC acceptance (--spec-synth-len 3)"
    assert label in report.title(synth)
    assert (
        report.to_markdown(synth).startswith("**dspark bench") and label in report.to_markdown(synth).splitlines()[0]
    )
    assert all(
        r["synthetic"] == "True" and r["synth_len"] in ("", "3.0")
        for r in csv.DictReader(io.StringIO(report.to_csv(synth)))
    )
    doc = report.to_json_doc(synth, PROV, run_id="r1", out=Path("x.jsonl"), overhead={"ratio": 1.01})
    assert doc["synthetic"] is True and label in doc["synthetic_note"]
    assert (
        "SYNTHETIC" not in report.title(ROWS)
        and report.to_json_doc(ROWS, PROV, run_id="r1", out=Path("x"), overhead={})["synthetic_note"] is None
    )


def test_markdown_table_shape():
    md = report.to_markdown(ROWS).splitlines()
    assert md[2] == "| " + " | ".join(report.COLUMNS) + " |"
    assert md[3] == "|" + "|".join(["---"] * len(report.COLUMNS)) + "|"
    assert md[5].startswith("| q8@5 | ocr | 104 | 99.0-110 | 2.00x | 300 | 240 | 80.0% | 5.00 |")


def test_json_doc_gives_provenance_once():
    doc = report.to_json_doc(ROWS, PROV, run_id="r1", out=Path("/tmp/x.jsonl"), overhead={"ratio": 1.02})
    assert doc["provenance"] == {"run_id": "r1", "synth_len": None}
    assert all("provenance" not in s and "run_id" not in s for s in doc["summaries"])
    assert doc["summaries"][1]["drafted"] == 300 and doc["jsonl"] == "/tmp/x.jsonl"


def test_plot_writes_a_png(tmp_path):
    rows = ROWS + [
        summary("plain", "math", 60.0, 58.0, 61.0, 1.0),
        summary("q8@5", "math", 150.0, 140.0, 155.0, 2.5, draft=drafting(10, 10, 2)),
    ]
    path = report.plot(rows, tmp_path / "sub" / "bench.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (700, 750)
        # the two panels are drawn: far more than a blank canvas's handful of colours
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 20


def test_an_interrupted_run_is_titled_so_in_markdown_and_json():
    """issue 28 item 2: `--format md` of an interrupted bench dropped the INTERRUPTED title the table had."""
    md = report.to_markdown(ROWS, partial=True).splitlines()
    assert md[0] == f"**INTERRUPTED, what was measured so far: {report.title(ROWS)}**"
    assert md[2:] == report.to_markdown(ROWS).splitlines()[2:]  # the same rows
    assert report.title(ROWS, partial=True) == f"INTERRUPTED, what was measured so far: {report.title(ROWS)}"
    doc = report.to_json_doc(ROWS, PROV, run_id="r1", out=Path("x"), overhead={}, partial=True)
    assert doc["partial"] is True and doc["title"].startswith("INTERRUPTED, what was measured so far: ")
    whole = report.to_json_doc(ROWS, PROV, run_id="r1", out=Path("x"), overhead={})
    assert "partial" not in whole and "title" not in whole and not report.to_markdown(ROWS).startswith("**INTERRUPTED")
