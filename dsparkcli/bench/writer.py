"""`dspark bench`'s JSONL writer: one line per record, flushed, each with the run's id and provenance block.

The provenance block (file sha256s: ~20 s for a 20 GB target the first time) is computed in a thread while the
first configuration loads and runs; records wait until it is ready (``flush(wait=True)``: the end of a run, or
its interruption, writes them all with it), so an interrupted bench keeps every finished line.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, TextIO

from dsparkcli.bench.jsonl import dumps


class RecordWriter:
    """Appends one JSON line per record and flushes it; records wait in ``pending`` for the provenance block."""

    def __init__(self, fh: TextIO, run_id: str, provenance_block: concurrent.futures.Future[dict[str, Any]]) -> None:
        self.fh, self.run_id, self.provenance = fh, run_id, provenance_block
        self.pending: list[dict[str, Any]] = []
        self.waited_s = 0.0  # time the bench sat waiting for the hashes (counts as overhead)

    def write(self, rec: dict[str, Any]) -> dict[str, Any]:
        full = {**rec, "run_id": self.run_id}
        self.pending.append(full)
        self.flush()
        return full

    def flush(self, *, wait: bool = False) -> None:
        if not self.pending or not (wait or self.provenance.done()):
            return
        t0 = time.perf_counter()
        block = self.provenance.result()
        self.waited_s += time.perf_counter() - t0
        for rec in self.pending:
            rec["provenance"] = block
            self.fh.write(dumps(rec) + "\n")
        self.fh.flush()
        self.pending.clear()
