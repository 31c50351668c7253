"""Rendering bench summaries: CSV, Markdown, table rows, the JSON document and the PNG plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from PIL import Image

from dsparkcli.bench import report


def summary(config, category, median, lo, hi, speedup, *, synthetic=False, synth_len=None, drafted=None, **extra):
    s = {
        "record": "summary",
        "config": config,
        "draft": None if config == "plain" else "d",
        "budget": None if config == "plain" else 5,
        "category": category,
        "synthetic": synthetic,
        "synth_len": synth_len,
        "prompts": 2,
        "reps": 3,
        "requests": 6,
        "tokens": 600,
        "tok_s": {"median": median, "min": lo, "max": hi},
        "speedup": speedup,
        "upstream_acceptance_length": None,
        "provenance": {"run_id": "r1", "synth_len": synth_len},
        "run_id": "r1",
    }
    if drafted is not None:
        s.update(
            {
                "drafted": drafted,
                "accepted": extra.get("accepted", 0),
                "steps": extra.get("steps", 1),
                "acceptance_rate": extra.get("rate"),
                "mean_length": extra.get("mean"),
                "accepted_per_pos": [],
                "acceptance_per_pos": extra.get("per_pos", []),
                "identical": extra.get("identical", 2),
                "identical_pct": 100.0 * extra.get("identical", 2) / 2,
                "divergent": extra.get("divergent", []),
            }
        )
    return s


ROWS = [
    summary("plain", "ocr", 52.25, 50.0, 55.5, 1.0),
    summary(
        "q8@5",
        "ocr",
        104.5,
        99.0,
        110.0,
        2.0,
        drafted=300,
        accepted=240,
        steps=60,
        rate=0.8,
        mean=5.0,
        per_pos=[1.0, 0.95, 0.875],
        identical=1,
        divergent=[{"prompt_id": "ocr-02", "first_divergence": 41, "output_sha256": "a", "plain_sha256": "b"}],
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
        "100 95 88",
    )
    assert len(report.COLUMNS) == len(q8)


def test_csv_has_one_row_per_summary_and_a_synthetic_column():
    text = report.to_csv(ROWS)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == list(report.CSV_FIELDS)
    assert [r["config"] for r in rows] == ["plain", "q8@5"]
    assert rows[1]["synthetic"] == "False" and rows[1]["speedup"] == "2.0" and rows[1]["mean_length"] == "5.0"
    assert rows[1]["first_divergences"] == "ocr-02@41"
    assert rows[1]["acceptance_per_pos"] == "1.0000 0.9500 0.8750"
    assert rows[0]["drafted"] == ""  # plain drafts nothing: empty, not 0


def test_synthetic_runs_are_labelled_everywhere(tmp_path):
    synth = [dict(r, synthetic=True, synth_len=None if r["config"] == "plain" else 3.0) for r in ROWS]
    label = "SYNTHETIC acceptance (--spec-synth-len 3)"
    assert label in report.title(synth)
    assert (
        report.to_markdown(synth).startswith("**dspark bench") and label in report.to_markdown(synth).splitlines()[0]
    )
    assert all(
        r["synthetic"] == "True" and r["synth_len"] in ("", "3.0")
        for r in csv.DictReader(io.StringIO(report.to_csv(synth)))
    )
    doc = report.to_json_doc(synth, run_id="r1", out=Path("x.jsonl"), overhead={"ratio": 1.01})
    assert doc["synthetic"] is True and label in doc["synthetic_note"]
    assert (
        "SYNTHETIC" not in report.title(ROWS)
        and report.to_json_doc(ROWS, run_id="r1", out=Path("x"), overhead={})["synthetic_note"] is None
    )


def test_markdown_table_shape():
    md = report.to_markdown(ROWS).splitlines()
    assert md[2] == "| " + " | ".join(report.COLUMNS) + " |"
    assert md[3] == "|" + "|".join(["---"] * len(report.COLUMNS)) + "|"
    assert md[5].startswith("| q8@5 | ocr | 104 | 99.0-110 | 2.00x | 300 | 240 | 80.0% | 5.00 |")


def test_json_doc_gives_provenance_once():
    doc = report.to_json_doc(ROWS, run_id="r1", out=Path("/tmp/x.jsonl"), overhead={"ratio": 1.02})
    assert doc["provenance"] == {"run_id": "r1", "synth_len": None}
    assert all("provenance" not in s and "run_id" not in s for s in doc["summaries"])
    assert doc["summaries"][1]["drafted"] == 300 and doc["jsonl"] == "/tmp/x.jsonl"


def test_plot_writes_a_png(tmp_path):
    rows = ROWS + [
        summary("plain", "math", 60.0, 58.0, 61.0, 1.0),
        summary("q8@5", "math", 150.0, 140.0, 155.0, 2.5, drafted=10, rate=1.0, mean=6.0),
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
    doc = report.to_json_doc(ROWS, run_id="r1", out=Path("x"), overhead={}, partial=True)
    assert doc["partial"] is True and doc["title"].startswith("INTERRUPTED, what was measured so far: ")
    whole = report.to_json_doc(ROWS, run_id="r1", out=Path("x"), overhead={})
    assert "partial" not in whole and "title" not in whole and not report.to_markdown(ROWS).startswith("**INTERRUPTED")
