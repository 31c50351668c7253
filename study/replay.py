"""A bench run's draft requests replayed by the torch draft: is a gap between training's validation and the
kit the data or the engine?

Training's validation (held-out templates) and llama-server's acceptance on the kit can differ for two
reasons: the kit is harder than the templates (the draft generalises less well), or llama.cpp runs the
trained weights differently from torch (a parity bug that the random-draft parity test did not catch,
quantisation of the exported draft, a tap read from the wrong layer). ``replay`` feeds each recorded
draft request's own output tokens through ``parity.simulate`` (the server's loop with the torch draft)
and sets the accepted and drafted counts next to the ones llama-server reported for that request. Equal
counts mean the engine is not where the gap is.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from dsparkcli import __version__
from dsparkcli.bench.provenance import file_facts
from dsparkcli.bench.records import PromptRecord, RequestRecord
from dsparkcli.bench.summaries import SummaryRecord
from dsparkcli.distill import export, parity
from dsparkcli.distill.model import DSparkDraft
from dsparkcli.distill.target import Target, load_target
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.protocol import mean_acceptance_length


@dataclass(frozen=True)
class ReplayedRequest:
    config: str
    category: str
    prompt_id: str
    rep: int
    budget: int
    engine_drafted: int  # timings.draft_n the server reported
    engine_accepted: int  # timings.draft_n_accepted
    drafted: int  # the torch draft in the server's loop, on the same output tokens
    accepted: int
    steps: int  # the torch replay's verification steps


@dataclass(frozen=True)
class ReplaySummary:
    category: str
    budget: int
    requests: int
    engine_drafted: int
    engine_accepted: int
    drafted: int
    accepted: int
    steps: int
    engine_mean_length: float | None  # the bench's own figure (its /metrics counters), for the same cell
    mean_length: float | None  # the torch replay's, llama.cpp's definition

    @property
    def accepted_ratio(self) -> float | None:
        """Torch replay's accepted tokens over the engine's: 1.0 when the engine drafts what torch does."""
        return self.accepted / self.engine_accepted if self.engine_accepted else None

    def to_record(self) -> dict[str, Any]:
        return {**asdict(self), "accepted_ratio": self.accepted_ratio}


def n_predict_for(stop_type: str | None, n_predicted: int, budget: int) -> int:
    """The n_predict to replay a finished request with. One that stopped at its limit had n_predict =
    n_predicted, and the server shortened its last drafts to fit; one that stopped at end-of-generation
    was never shortened, so any larger limit replays it."""
    return n_predicted if stop_type == "limit" else n_predicted + budget + 2


def load_pair(target: Path, draft: Path, threads: int) -> tuple[Target, DSparkDraft]:
    """The target dequantised into torch and the draft read back from its GGUF, on the CPU."""
    torch.set_num_threads(threads)
    return load_target(target)[0], export.read_gguf(draft).eval().float()


def record_header(kind: str, engine: Engine, **files: Path) -> dict[str, Any]:
    """What a replay record says about where it came from: versions, the engine, each file's sha256."""
    return {
        "kind": kind,
        "dspark_version": __version__,
        "torch": torch.__version__,
        "engine": {"commit": engine.commit, "backend": engine.backend},
        **{role: asdict(file_facts(path)) for role, path in files.items()},
    }


def replay(
    records: Iterable[Mapping[str, Any]],
    target: Target,
    draft: DSparkDraft,
    tokenize: Callable[[str], list[int]],
    *,
    budgets: Sequence[int] | None = None,
    on_request: Callable[[ReplayedRequest], None] | None = None,
) -> list[ReplayedRequest]:
    """Every non-synthetic draft request of a bench run (its ``prompt`` and ``request`` records), replayed.

    ``tokenize`` must be the engine's (llama-server /tokenize), so the prompt is the token sequence the
    server drafted from. Requests of a synthetic run or a --spec-synth-len arm are skipped: their counters
    are not the draft's."""
    recs = list(records)
    prompts = {p.prompt_id: p for p in (PromptRecord.from_record(r) for r in recs if r.get("record") == "prompt")}
    ids: dict[str, list[int]] = {}
    out: list[ReplayedRequest] = []
    for rec in recs:
        if rec.get("record") != "request":
            continue
        req = RequestRecord.from_record(rec)
        if req.budget is None or req.synthetic or req.synth_len is not None or not req.tokens:
            continue
        if budgets is not None and req.budget not in budgets:
            continue
        if req.prompt_id not in prompts:
            raise ValueError(f"request {req.config}/{req.prompt_id} has no prompt record in this run")
        if prompts[req.prompt_id].images_sha256:
            continue  # the torch target has no vision tower
        if req.prompt_id not in ids:
            ids[req.prompt_id] = tokenize(prompts[req.prompt_id].rendered)
        sim = parity.simulate(
            target,
            draft,
            ids[req.prompt_id],
            req.tokens,
            req.budget,
            n_predict_for(req.stop_type, req.n_predicted, req.budget),
        )
        row = ReplayedRequest(
            req.config,
            req.category,
            req.prompt_id,
            req.rep,
            req.budget,
            req.draft_n,
            req.draft_n_accepted,
            sim.drafted,
            sim.accepted,
            sim.steps,
        )
        out.append(row)
        if on_request is not None:
            on_request(row)
    return out


def summarise(rows: Sequence[ReplayedRequest], records: Iterable[Mapping[str, Any]] = ()) -> list[ReplaySummary]:
    """Per (category, budget), and per budget over all categories (category ``all``), with the bench's own
    mean acceptance length of that cell when its summary records are given."""
    engine_len: dict[tuple[str, int], float | None] = {}
    for rec in records:
        if rec.get("record") == "summary" and rec.get("budget") is not None:
            s = SummaryRecord.from_record(rec)
            if s.drafting is not None and not s.synthetic:
                engine_len[(s.category, int(s.budget))] = s.drafting.counters.mean_length
    cells: dict[tuple[str, int], list[ReplayedRequest]] = defaultdict(list)
    for r in rows:
        cells[(r.category, r.budget)].append(r)
        cells[("all", r.budget)].append(r)
    out = []
    for (category, budget), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0] == "all", kv[0][0])):
        accepted, steps = sum(r.accepted for r in rs), sum(r.steps for r in rs)
        out.append(
            ReplaySummary(
                category,
                budget,
                len(rs),
                sum(r.engine_drafted for r in rs),
                sum(r.engine_accepted for r in rs),
                sum(r.drafted for r in rs),
                accepted,
                steps,
                engine_len.get((category, budget)),
                mean_acceptance_length(accepted, steps),
            )
        )
    return out
