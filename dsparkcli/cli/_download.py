"""Asking before large downloads and showing their progress: shared by fetch, run and serve."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import typer

from dsparkcli.cli._output import err
from dsparkcli.hub.download import Progress as DownloadProgress
from dsparkcli.hub.fetch import PlannedFile
from dsparkcli.units import format_size


def show_plan(planned: list[PlannedFile]) -> None:
    for p in planned:
        state = (
            "present"
            if p.present
            else (f"resume at {format_size(p.partial_bytes)}" if p.partial_bytes else "download")
        )
        err.print(f"  {p.role:<7} {p.filename}  {format_size(p.size)}  {p.repo}  [{state}]", markup=False)


def ask_to_download(planned: list[PlannedFile], *, show: bool = True) -> bool | None:
    """Show what will be downloaded (``show``) and ask; None without a terminal to ask on.

    The asking half of the one confirm policy: ``hub.fetch.confirm_large`` decides when to ask, and
    words the refusal when it cannot."""
    total = sum(p.to_download for p in planned)
    if not sys.stdin.isatty():
        return None
    if show:
        show_plan(planned)
    return typer.confirm(f"Download {format_size(total)}?", default=True, err=True)


def confirm_downloads(planned: list[PlannedFile]) -> bool | None:
    """The ``confirm`` callback of run and serve (hub.fetch.Confirm)."""
    return ask_to_download(planned)


class DownloadBars:
    """``on_progress`` for downloads: the bars appear with the first event and go with ``finish()``.

    A live display redirects stdout while it runs, which turns every streamed write into a line of its
    own; so it lives only while bytes arrive, and `run` finishes it before the answer streams."""

    def __init__(self, disable: bool) -> None:
        # off a terminal a bar is no use, and rich's live display still ends with a newline there (stderr
        # of `dspark run ... 2>log` began with an empty line)
        self.disable = disable or not err.is_terminal
        self._progress: Any = None
        self._tasks: dict[str, int] = {}

    def __call__(self, event: DownloadProgress) -> None:
        if self.disable:
            return
        if event.kind == "done" and event.role not in self._tasks:
            return  # present and verified before: nothing was fetched or hashed, so no bar
        if self._progress is None:
            # deferred: rich.progress costs ~30 ms that commands without a bar would pay at start-up
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
            self._progress.start()
        if event.role not in self._tasks:
            verb = "verifying" if event.kind == "verify" else "fetching"
            self._tasks[event.role] = self._progress.add_task(f"{verb} {event.role}", total=event.total or None)
        self._progress.update(self._tasks[event.role], completed=event.done, total=event.total or None)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress, self._tasks = None, {}


@contextlib.contextmanager
def download_progress(disable: bool = False) -> Iterator[DownloadBars]:
    bars = DownloadBars(disable)
    try:
        yield bars
    finally:
        bars.finish()
