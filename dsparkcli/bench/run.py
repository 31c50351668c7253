"""`dspark bench`: plain decoding vs every draft × budget, on one prompt kit, with identity checks.

One llama-server per configuration, started before timing and warmed up (tune passes a
``bench.servers.ServerPool`` instead, which keeps loaded servers across its phases and, made with
``share=True``, runs a smaller budget on a larger one's server through a per-request
``speculative.n_max``); every prompt × rep runs greedy through ``/completion`` with
``return_tokens`` so outputs are compared token by token against plain decoding from the same run.
``/metrics`` is read around each (rep, category) block: its counters give verification steps and
per-position acceptance, which the per-response ``timings`` lack.

Everything lands in a JSONL file, one line flushed per event, so Ctrl-C keeps what was measured:

* ``prompt``    once per prompt: the templated text that was sent (images by sha256)
* ``request``   one per config × prompt × rep: timings, output tokens, hashes, identity vs plain
* ``counters``  one per config × rep × category: /metrics deltas (drafted, accepted, steps, per position)
* ``summary``   one per config × category (and category ``all``): the figures the report shows
* ``overhead``  one per run: wall time vs Σ generation time + one load per configuration

With ``--concurrency`` (``plan.concurrency``) every level runs plain and every draft × budget on a
server with ``-np N`` and N clients in flight (``bench.load``); per pass of the kit a ``pass`` record
(aggregate tok/s), and per configuration × concurrency a ``load_summary`` row instead of ``summary``.

Each carries the run's provenance. Each configuration is summarised from its own records as soon as it
ends (``stats.summarize_config``); ``stats.summarize`` rebuilds the same rows from a JSONL file.
Plan and inputs: ``bench.plan``; one configuration measured: ``bench.arms`` (its requests:
``bench.requests``); the lines: ``bench.writer``; record types: ``bench.records``, ``bench.summaries``.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dsparkcli import config
from dsparkcli.bench import provenance
from dsparkcli.bench.arms import ArmRecords, run_arm, run_load_arm
from dsparkcli.bench.plan import Arm, BenchPlan
from dsparkcli.bench.prompts import image_base64
from dsparkcli.bench.records import PLAIN, OverheadRecord, read_jsonl
from dsparkcli.bench.requests import MEDIA_MARKER, RunState, Totals
from dsparkcli.bench.servers import ServerPool, plan_hosts
from dsparkcli.bench.stats import medians, summarize, summarize_config, summarize_load
from dsparkcli.bench.summaries import ALL, Summary, SummaryRecord
from dsparkcli.bench.writer import RecordWriter
from dsparkcli.llama.engine import Engine
from dsparkcli.outputs import check_output_dir, check_output_file


@dataclass(frozen=True)
class BenchResult:
    run_id: str
    out: Path
    summaries: tuple[Summary, ...]  # the summary rows as written, in order (``to_record()``: their lines)
    provenance: dict[str, Any]  # the block every line carries
    overhead: OverheadRecord
    synthetic: bool


@dataclass(frozen=True)
class MeasuredSoFar:
    """What an interrupted run measured: its summary rows and the provenance its lines carry (None when
    no line reached the file)."""

    summaries: tuple[Summary, ...]
    provenance: dict[str, Any] | None


def summaries_so_far(out: Path, run_id: str, upstream: Sequence[tuple[str, float]] = ()) -> MeasuredSoFar:
    """The summary rows of what an interrupted run measured: rebuilt from its request and counters
    records in ``out`` (a configuration cut short is summarised over the requests it finished)."""
    records = read_jsonl(out, run_id) if out.is_file() else []
    prov = next((r["provenance"] for r in records if r.get("provenance")), None)
    return MeasuredSoFar(tuple(summarize(records, dict(upstream))), prov)


def default_out_path(run_id: str) -> Path:
    return config.cache_dir() / "bench" / f"bench-{run_id}.jsonl"


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def _joined(earlier: ArmRecords | None, later: ArmRecords) -> ArmRecords:
    if earlier is None:
        return later
    return ArmRecords(
        earlier.requests + later.requests, earlier.counters + later.counters, earlier.passes + later.passes
    )


def _summaries(
    arm: Arm, mine: ArmRecords, categories: list[str], state: RunState, upstream: dict[str, float], load_s: float
) -> list[SummaryRecord]:
    """The configuration's summary rows, from its own records; the ``all`` row carries its load time."""
    rows = summarize_config(mine.requests, mine.counters, categories, state.plain_median, upstream)
    if arm.name == PLAIN:
        state.plain_median = medians(rows)
    return [replace(r, load_s=load_s) if r.category == ALL else r for r in rows]


def new_pool(engine: Engine, *, share: bool) -> ServerPool:
    """A pool of bench servers (``bench.servers``); ``share`` needs an engine that honours per-request
    draft settings (dspark's patch series)."""
    return ServerPool(engine, share=share, env={"LLAMA_MEDIA_MARKER": MEDIA_MARKER})


def run_bench(
    engine: Engine,
    plan: BenchPlan,
    *,
    out: Path | None = None,
    run_id: str | None = None,
    argv: list[str] | None = None,
    on_request: Callable[[str, str], None] | None = None,
    pool: ServerPool | None = None,
) -> BenchResult:
    """Run every configuration of ``plan``; append records to ``out`` (JSONL) as they are measured.

    ``on_request(config, prompt_id)`` is called after each request (warm-up included), for progress.
    ``pool``: servers kept across configurations and calls (tune); without one, every configuration
    starts its own server and stops it before the next one starts.
    Raises BenchError when a draft configuration drafts nothing over a whole pass of the prompts.
    """
    t_wall0 = time.perf_counter()
    plan.validate()
    run_id = run_id or new_run_id()
    out = Path(out) if out is not None else default_out_path(run_id)
    if not out.parent.exists():
        check_output_dir(out.parent, what="bench records folder")
        out.parent.mkdir(parents=True, exist_ok=True)
    out = check_output_file(
        out,
        what="bench records",
        inputs=[plan.target, plan.mmproj, *(d.path for d in plan.drafts), *(s.path for s in plan.specs if s.path)],
    )
    files: dict[str, Path | None] = {"target": plan.target, "mmproj": plan.mmproj}
    files.update({f"draft:{d.label}": d.path for d in plan.drafts})
    files.update({f"draft:{s.label}": s.path for s in plan.specs if s.path is not None})  # --spec draft-simple
    hashing = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dspark-provenance")
    prov = hashing.submit(
        provenance.collect,
        engine,
        files,
        argv=argv,
        reps=plan.reps,
        extra={
            "run_id": run_id,
            "model": plan.model_name,
            "n_predict": plan.n_predict,
            "warmup": plan.warmup,
            "seed": plan.seed,
            "rounds": plan.rounds,
            "ignore_eos": plan.ignore_eos,
            "p_min": plan.p_min,
            "synth_len": plan.synth_len,
            "synthetic": plan.synthetic,
            "acceptance": plan.acceptance.label,
            "acceptance_why": plan.acceptance.why,
            "ctx": plan.ctx,
            **({"concurrency": list(plan.concurrency)} if plan.concurrency else {}),
        },
    )
    hashing.shutdown(wait=False)
    images_b64 = {p.id: [image_base64(i) for i in p.images] for p in plan.prompts}
    image_sha = {p.id: [provenance.file_facts(i).sha256 for i in p.images] for p in plan.prompts}
    categories = list(dict.fromkeys(p.category for p in plan.prompts))  # kit order
    upstream = dict(plan.upstream_acceptance)
    totals, state = Totals(), RunState()
    summaries: list[Summary] = []
    with open(out, "a", encoding="utf-8") as fh:
        writer = RecordWriter(fh, run_id, prov)
        try:
            for concurrency in plan.concurrency:  # plain first at every level: the drafts' speedups need it
                for arm in plan.arms():
                    load_s, mine = run_load_arm(
                        engine, plan, arm, concurrency, writer, state, totals, images_b64, image_sha, on_request
                    )
                    row = summarize_load(
                        mine.requests, mine.counters, mine.passes, state.plain_load_tok_s.get(concurrency)
                    )
                    if row is not None:
                        if arm.name == PLAIN:
                            state.plain_load_tok_s[concurrency] = row.tok_s.median
                        summaries.append(replace(row, load_s=load_s))
                        writer.write(summaries[-1].to_record())
            single = plan.arms() if not plan.concurrency else []
            configs = [plan.server_config(a) for a in single]
            mine_pool = pool or new_pool(engine, share=False)
            try:
                kept: dict[str, ArmRecords] = {}  # every round's records of a configuration
                first_load: dict[str, float] = {}
                for rnd in range(plan.rounds):
                    for arm, host in zip(single, plan_hosts(configs) if mine_pool.share else configs):
                        load_s, mine = run_arm(
                            mine_pool,
                            host,
                            plan,
                            arm,
                            writer,
                            state,
                            totals,
                            images_b64,
                            image_sha,
                            categories,
                            on_request,
                            rep0=rnd * plan.reps,
                        )
                        mine = _joined(kept.get(arm.name), mine)
                        kept[arm.name] = mine
                        first_load.setdefault(arm.name, load_s)
                        if rnd == plan.rounds - 1:  # plain's summary comes first: the drafts' speedups need it
                            for row in _summaries(arm, mine, categories, state, upstream, first_load[arm.name]):
                                summaries.append(row)
                                writer.write(row.to_record())
                        if pool is None:
                            t_stop0 = time.perf_counter()
                            mine_pool.close()
                            totals.stop_s += time.perf_counter() - t_stop0
            finally:
                if pool is None:
                    mine_pool.close()
        finally:
            writer.flush(wait=True)  # whatever happened, every measured line reaches the file, with provenance
        overhead = OverheadRecord(
            wall_s=time.perf_counter() - t_wall0,
            generation_s=totals.generation_s,
            load_s=totals.load_s,
            request_s=totals.request_s,
            provenance_s=writer.waited_s,
            stop_s=totals.stop_s,
            configurations=len(plan.arms()) * max(1, len(plan.concurrency)),
            requests=plan.total_requests(),
            synthetic=plan.synthetic,
        )
        writer.write(overhead.to_record())
    return BenchResult(
        run_id=run_id,
        out=out,
        summaries=tuple(summaries),
        provenance=prov.result(),
        overhead=overhead,
        synthetic=plan.synthetic,
    )
