"""Line-per-record JSON files, as bench and the study kit's scripts write and read them: a sink that flushes
every line (an interrupted run keeps every finished one), and readers tolerant of a line cut by a kill."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO


def dumps(rec: Mapping[str, Any], *, compact: bool = True) -> str:
    return json.dumps(rec, separators=(",", ":")) if compact else json.dumps(rec)


class JsonlSink:
    """Appends one JSON line per record and flushes it: an interrupted run keeps every finished line.

    ``mirrors``: more files that get every line too; ``fsync``: survive the machine going away, not
    only the process.
    """

    def __init__(
        self, path: Path | TextIO, *, mirrors: Sequence[Path] = (), compact: bool = True, fsync: bool = False
    ) -> None:
        self.fhs: list[TextIO] = []
        self._owned: list[TextIO] = []
        for p in [path, *mirrors]:
            if isinstance(p, Path):
                p.parent.mkdir(parents=True, exist_ok=True)
                fh = open(p, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
                self._owned.append(fh)
            else:
                fh = p
            self.fhs.append(fh)
        self.compact, self.fsync = compact, fsync

    def write(self, rec: Mapping[str, Any]) -> None:
        line = dumps(rec, compact=self.compact) + "\n"
        for fh in self.fhs:
            fh.write(line)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())

    def close(self) -> None:
        for fh in self._owned:
            fh.close()


def iter_jsonl(
    path: Path, on_bad_line: Callable[[int, str], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of every non-empty line. A line that is not JSON raises, unless
    ``on_bad_line(lineno, line)`` is given (a file cut mid-line by a killed run)."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if on_bad_line is None:
                raise
            on_bad_line(n, line)
            continue
        yield n, rec


def read_jsonl(path: Path, run_id: str | None = None) -> list[dict[str, Any]]:
    """Records of one run (the last one in the file when ``run_id`` is None)."""
    records = [rec for _, rec in iter_jsonl(path)]
    if run_id is None and records:
        run_id = records[-1].get("run_id")
    return [r for r in records if r.get("run_id") == run_id]


def foreign_jsonl(path: Path, keys: Sequence[str] = ("record", "run_id")) -> str | None:
    """Why ``path`` is not a file of these records (its first non-empty line is not a JSON object with
    ``keys``), or None when it is, is empty or does not exist. Appending to a user's notes or to another tool's
    JSONL would mix two files past separating (bench --out appends)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.strip():
                    break
            else:
                return None
    except FileNotFoundError:
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return "its first line is not JSON"
    if not isinstance(rec, dict) or any(k not in rec for k in keys):
        return f"its first line is not a record of dspark's (no {' or '.join(repr(k) for k in keys)})"
    return None
