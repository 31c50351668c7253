"""A pytest plugin (``-p support.lane_dump``) that prints each collected test's lanes, ``LANE <id> <a,b>``, and
the engine the session's tests would find, ``ENGINE <where it came from>`` (or ``ENGINE none``)."""

from __future__ import annotations

LANES = ("engine", "study", "torch", "timing")


def pytest_collection_finish(session) -> None:
    for item in session.items:
        marks = sorted({m.name for m in item.iter_markers()} & set(LANES))
        print("LANE", item.nodeid, ",".join(marks) or "-")
    from dsparkcli.errors import EngineNotFoundError
    from dsparkcli.llama.engine import resolve_engine

    try:
        print("ENGINE", resolve_engine().source)
    except EngineNotFoundError:
        print("ENGINE none")
