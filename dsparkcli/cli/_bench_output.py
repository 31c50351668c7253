"""How `dspark bench` shows its summaries: a rich table, or JSON, CSV or Markdown on stdout (the formats
themselves are bench.report's). Imported when a bench has run, not by its --help."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from dsparkcli.bench import report
from dsparkcli.bench.summaries import ALL, LoadSummaryRecord, Summary, SummaryRecord
from dsparkcli.cli._output import out, print_json


def render_table(
    summaries: Sequence[Summary], provenance: report.Provenance | None = None, *, partial: bool = False
) -> Table:
    synthetic = report.is_synthetic(summaries)
    table = Table(
        title=report.title(summaries, provenance, partial=partial), title_style="bold red" if synthetic else "bold"
    )
    if report.is_load(summaries):
        loads = [s for s in summaries if isinstance(s, LoadSummaryRecord)]
        for col in report.LOAD_COLUMNS:
            table.add_column(col, justify="left" if col == "config" else "right", no_wrap=col == "config")
        last = None
        for ls, row in zip(loads, report.load_table_rows(loads)):
            if last is not None and ls.concurrency != last:
                table.add_section()
            last = ls.concurrency
            table.add_row(*row)
        table.caption = report.crossover_note(loads)
        return table
    for col in report.COLUMNS:
        left = col in ("config", "category", "1st divergence")
        table.add_column(
            col, justify="left" if left else "right", overflow="fold", no_wrap=col in ("config", "category")
        )
    last = None
    rows = [s for s in summaries if isinstance(s, SummaryRecord)]
    for s, row in zip(rows, report.table_rows(rows)):
        if last is not None and s.config != last:
            table.add_section()
        last = s.config
        table.add_row(*row, style="bold" if s.category == ALL else None)
    return table


def emit(
    summaries: Sequence[Summary],
    provenance: report.Provenance | None,
    fmt: str,
    *,
    run_id: str,
    jsonl: Path,
    overhead: dict[str, Any] | None,
    partial: bool = False,
) -> None:
    """The summary rows on stdout in ``fmt``; ``partial``: an interrupted run's (its title says so in the
    table and Markdown, the --json document has ``partial`` and that title; CSV has no title, the error
    line on stderr says it)."""
    if fmt == "json":
        doc = report.to_json_doc(
            summaries, provenance, run_id=run_id, out=jsonl, overhead=overhead or {}, partial=partial
        )
        print_json(doc)
    elif fmt == "csv":
        sys.stdout.write(report.to_csv(summaries))
    elif fmt == "md":
        sys.stdout.write(report.to_markdown(summaries, provenance, partial=partial))
    else:
        out.print(render_table(summaries, provenance, partial=partial))
