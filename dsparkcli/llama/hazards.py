"""What the pinned engine was measured to get wrong, said before a server starts (not refused: one GPU and
one pair were measured)."""

from __future__ import annotations

from dsparkcli.llama.engine import Engine, describe_backend

# Measured on the H200 (BENCHMARKS.md, REAL pair, study/results/h200/load2/): llama.cpp 0c1e570 with a DSpark
# draft aborts at 16 slots on CUDA (common.cpp:2158 get_sub_batch: a token id outside the vocabulary
# reaches the verification batch); 8 slots ran clean, and 16 slots on the CPU engine too. Said, not refused:
# only one GPU and one pair were measured.
DRAFT_SLOTS_MEASURED_CLEAN = 8


def slot_hazard(engine: Engine, *, drafting: bool, parallel: int) -> str | None:
    """A warning for a drafting server with more slots than were measured clean on this backend, or None."""
    backend = engine.backend or describe_backend(engine)
    if not drafting or parallel <= DRAFT_SLOTS_MEASURED_CLEAN or backend != "cuda":
        return None
    return (
        f"{parallel} slots with a DSpark draft on CUDA: llama.cpp 0c1e570 aborted at 16 slots on the H200 "
        f"(common.cpp:2158 get_sub_batch: a token id outside the vocabulary; BENCHMARKS.md), "
        f"{DRAFT_SLOTS_MEASURED_CLEAN} ran clean"
    )
