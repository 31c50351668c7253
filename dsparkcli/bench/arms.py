"""One `dspark bench` configuration measured: ``run_arm`` (every rep x category x prompt on its server, one at
a time, /metrics read around each (rep, category) block) and ``run_load_arm`` (a --concurrency level: N clients in
flight on a server with -np N, a pass of the kit each, /metrics around each pass). Each returns the
configuration's own records (``ArmRecords``), all its summary needs, and writes them as they are measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from dsparkcli.bench import load
from dsparkcli.bench.plan import Arm, BenchPlan
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import CountersRecord, PassRecord, RequestRecord
from dsparkcli.bench.requests import (
    MEDIA_MARKER,
    RunState,
    Totals,
    completion_body,
    render_once,
    request_record,
    surviving,
    timed_completion,
)
from dsparkcli.bench.servers import ServerPool
from dsparkcli.bench.summaries import ALL
from dsparkcli.bench.writer import RecordWriter
from dsparkcli.errors import BenchError
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.protocol import SPEC_N_MAX, SpecCounters, TypeCounters, TypeStats, type_stats
from dsparkcli.llama.server import LlamaServer, ServerConfig


@dataclass
class ArmRecords:
    """One configuration's own measurements: all its summary needs."""

    requests: list[RequestRecord] = field(default_factory=list)
    counters: list[CountersRecord] = field(default_factory=list)
    passes: list[PassRecord] = field(default_factory=list)


def model_drafts(arm: Arm) -> bool:
    """A draft model runs (a DSpark or classic draft), which must draft: not n-gram speculation."""
    return arm.draft is not None


def drafted_nothing(arm: Arm, requests: int, srv: LlamaServer) -> BenchError:
    return BenchError(
        f"configuration {arm.name} drafted nothing in {requests} requests "
        f"(check that the draft fits the target, --p-min, --spec-draft-n-min)",
        hint=f"server log: {srv.log_path}",
    )


TYPE_STATS_WAIT_S = 5.0  # the log's writer thread is behind the response by far less


def read_type_stats(srv: LlamaServer, lines: int) -> TypeStats:
    """A chain's per-type statistics from its server's log, once it holds ``lines`` lines per type (one per
    finished request: the log is written by llama.cpp's log thread, after the response may have left)."""
    deadline = time.monotonic() + TYPE_STATS_WAIT_S
    while True:
        stats = type_stats(srv.log_path.read_text(errors="replace"))
        if stats.lines >= lines or time.monotonic() > deadline:
            if stats.lines < lines:
                raise BenchError(
                    f"{srv.log_path}: {stats.lines} per-type statistics lines after {lines} requests "
                    "(llama-server at -lv 4 writes one per request)"
                )
            return stats
        time.sleep(0.02)


def run_arm(
    pool: ServerPool,
    plan_host: ServerConfig,
    plan: BenchPlan,
    arm: Arm,
    writer: RecordWriter,
    state: RunState,
    totals: Totals,
    images_b64: dict[str, list[str]],
    image_sha: dict[str, list[str]],
    categories: list[str],
    on_request: Callable[[str, str], None] | None,
    rep0: int = 0,
) -> tuple[float, ArmRecords]:
    """One configuration: its server from the pool (started, or a loaded one that can serve it), warm up,
    run every rep × category × prompt (reps numbered from ``rep0``: a later round's). Returns (load
    seconds, 0 on a reused server; its records)."""
    is_draft = arm.speculates  # a server that drafts has counters to read
    mine = ArmRecords()
    held, draft_fields = pool.acquire(plan.server_config(arm), plan_host)
    srv = held.server
    # the pool stops the server: after this arm (bench), or when the next one cannot use it (tune)
    load_s = held.load_s if held.uses == 1 else 0.0  # a reused server's load was paid by an earlier arm
    totals.load_s += load_s
    client = srv.client
    assert client is not None
    server_argv = srv.argv
    rendered = render_once(client, plan, state, writer, image_sha)

    def fields(p: Prompt) -> dict[str, Any]:  # a shared server's budget, or the prompt's category's (auto)
        return {**draft_fields, **arm.request_fields(p.category)}

    def request(p: Prompt) -> tuple[dict[str, Any], float]:
        result = surviving(
            srv,
            arm.name,
            lambda: timed_completion(
                client, {**completion_body(plan, rendered[p.id], images_b64[p.id]), **fields(p)}, totals
            ),
        )
        if on_request:
            on_request(arm.name, p.id)
        return result

    # a server reused from an earlier arm has written its lines: they were waited for at its last block
    lines_start = read_type_stats(srv, 0).lines if srv.config.type_stats else None
    for i in range(plan.warmup):  # untimed: first-use allocations, caches, page-ins
        request(plan.prompts[i % len(plan.prompts)])

    drafted = 0
    # counters only move while a request runs, so each block's "after" is the next one's "before"
    before = SpecCounters.from_metrics(client.metrics()) if is_draft else None
    # a chain: which type proposed, from the log's per-type lines (cumulative, one per request: warm-ups too)
    types_before = read_type_stats(srv, lines_start + plan.warmup) if lines_start is not None else None
    answered = 0
    for rep in range(rep0, rep0 + plan.reps):
        for category in categories:
            for p in (q for q in plan.prompts if q.category == category):
                resp, request_ms = request(p)
                rec = request_record(plan, arm, p, rep, resp, request_ms, server_argv, state)
                if SPEC_N_MAX in fields(p):
                    rec = replace(rec, request_n_max=fields(p)[SPEC_N_MAX])
                mine.requests.append(rec)
                writer.write(rec.to_record())
                answered += 1
            if before is not None:
                after = SpecCounters.from_metrics(client.metrics())
                by_type: tuple[TypeCounters, ...] = ()
                if types_before is not None:
                    assert lines_start is not None
                    types_after = read_type_stats(srv, lines_start + plan.warmup + answered)
                    by_type, types_before = types_after.minus(types_before), types_after
                block = CountersRecord(
                    config=arm.name,
                    category=category,
                    rep=rep,
                    counters=after.minus(before),
                    draft=arm.draft_label,
                    budget=arm.budget,
                    synthetic=plan.synthetic,
                    server_argv=tuple(server_argv),
                    by_type=by_type,
                )
                before = after
                drafted += block.counters.drafted
                mine.counters.append(block)
                writer.write(block.to_record())
        # a whole pass without one draft: fail now, not in an hour (an adaptive budget may choose that, and
        # n-gram speculation finds nothing to draft in text that does not repeat itself: its row says 0)
        if is_draft and drafted == 0 and not arm.adaptive and model_drafts(arm):
            raise drafted_nothing(arm, len(plan.prompts) * (rep - rep0 + 1), srv)
    return load_s, mine


def run_load_arm(
    engine: Engine,
    plan: BenchPlan,
    arm: Arm,
    concurrency: int,
    writer: RecordWriter,
    state: RunState,
    totals: Totals,
    images_b64: dict[str, list[str]],
    image_sha: dict[str, list[str]],
    on_request: Callable[[str, str], None] | None,
) -> tuple[float, ArmRecords]:
    """One configuration at one concurrency: a server with -np N, a warm-up pass, then ``reps`` passes in
    which each of the N clients streams the whole kit (from its own starting prompt). Returns (load s, records)."""
    is_draft = arm.speculates  # a server that drafts has counters to read
    mine = ArmRecords()
    srv = LlamaServer(engine, plan.server_config(arm, concurrency), env={"LLAMA_MEDIA_MARKER": MEDIA_MARKER})
    t_load0 = time.perf_counter()
    with srv:
        load_s = time.perf_counter() - t_load0
        totals.load_s += load_s
        assert srv.client is not None
        server_argv = srv.argv
        rendered = render_once(srv.client, plan, state, writer, image_sha)
        clients = [ServerClient(srv.url, api_key=srv.config.api_key) for _ in range(concurrency)]

        def send(c: ServerClient, p: Prompt) -> tuple[dict[str, Any], float | None, float]:
            result = surviving(
                srv,
                f"{arm.name} x{concurrency}",
                lambda: load.stream_completion(c, completion_body(plan, rendered[p.id], images_b64[p.id])),
            )
            if on_request:
                on_request(f"{arm.name} x{concurrency}", p.id)
            return result

        try:
            kit = list(plan.prompts)
            if plan.warmup:  # untimed, all clients at once: every slot's first-use costs are paid here
                _, wall = load.run_pass(
                    clients, [load.rotated(kit, k, concurrency)[: plan.warmup] for k in range(concurrency)], send
                )
                totals.generation_s += wall
                totals.request_s += wall
            jobs = [load.rotated(kit, k, concurrency) for k in range(concurrency)]
            before = SpecCounters.from_metrics(srv.client.metrics()) if is_draft else None
            for rep in range(plan.reps):
                answers, wall = load.run_pass(clients, jobs, send)
                totals.generation_s += wall
                totals.request_s += wall
                tokens = 0
                for a in answers:
                    rec = request_record(
                        plan,
                        arm,
                        a.job,
                        rep,
                        a.response,
                        a.latency_ms,
                        server_argv,
                        state,
                        answer=a,
                        concurrency=concurrency,
                    )
                    tokens += rec.n_predicted
                    mine.requests.append(rec)
                    writer.write(rec.to_record())
                rnd = PassRecord(
                    config=arm.name,
                    concurrency=concurrency,
                    rep=rep,
                    requests=len(answers),
                    tokens=tokens,
                    wall_s=wall,
                    draft=arm.draft_label,
                    budget=arm.budget,
                    synthetic=plan.synthetic,
                )
                mine.passes.append(rnd)
                writer.write(rnd.to_record())
                if before is not None:
                    after = SpecCounters.from_metrics(srv.client.metrics())
                    block = CountersRecord(
                        config=arm.name,
                        category=ALL,
                        rep=rep,
                        counters=after.minus(before),
                        draft=rnd.draft,
                        budget=arm.budget,
                        synthetic=plan.synthetic,
                        server_argv=tuple(server_argv),
                        concurrency=concurrency,
                    )
                    before = after
                    mine.counters.append(block)
                    writer.write(block.to_record())
                    if sum(c.counters.drafted for c in mine.counters) == 0 and not arm.adaptive and model_drafts(arm):
                        raise drafted_nothing(arm, len(mine.requests), srv)
        finally:
            for c in clients:
                c.close()
        t_stop0 = time.perf_counter()
    totals.stop_s += time.perf_counter() - t_stop0
    return load_s, mine
