"""Asking before large downloads and showing their progress: shared by fetch, run and serve."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from dsparkcli import hub
from dsparkcli.cli._output import err
from dsparkcli.errors import UsageError


def show_plan(planned: list[hub.PlannedFile]) -> None:
    for p in planned:
        state = "present" if p.present else (f"resume at {hub.format_size(p.partial_bytes)}" if p.partial_bytes else "download")
        err.print(f"  {p.role:<7} {p.filename}  {hub.format_size(p.size)}  {p.repo}  [{state}]", markup=False)


def confirm_downloads(planned: list[hub.PlannedFile]) -> bool:
    """Show what will be downloaded and ask; without a terminal, refuse with a one-line hint."""
    total = sum(p.to_download for p in planned)
    if not sys.stdin.isatty():
        raise UsageError(f"{hub.format_size(total)} of downloads needed and stdin is not a terminal; pass --yes")
    show_plan(planned)
    return typer.confirm(f"Download {hub.format_size(total)}?", default=True, err=True)


@contextlib.contextmanager
def download_progress(disable: bool = False) -> Iterator[Callable[[hub.Progress], None]]:
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True, disable=disable) as progress:
        tasks: dict[str, int] = {}

        def on_progress(event: hub.Progress) -> None:
            if event.role not in tasks:
                verb = "verifying" if event.kind == "verify" else "fetching"
                tasks[event.role] = progress.add_task(f"{verb} {event.role}", total=event.total or None)
            progress.update(tasks[event.role], completed=event.done, total=event.total or None)

        yield on_progress
