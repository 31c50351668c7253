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
Plan and inputs: ``bench.plan``; record types: ``bench.records``.
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO, TypeVar

from dsparkcli import config
from dsparkcli.bench import load, provenance
from dsparkcli.bench.plan import Arm, BenchPlan
from dsparkcli.bench.prompts import Prompt, image_base64
from dsparkcli.bench.records import (
    ALL,
    PLAIN,
    CountersRecord,
    Identity,
    OverheadRecord,
    PassRecord,
    PromptRecord,
    RequestRecord,
    SummaryRecord,
    dumps,
    read_jsonl,
)
from dsparkcli.bench.servers import ServerPool, plan_hosts
from dsparkcli.bench.stats import (
    first_divergence,
    medians,
    summarize,
    summarize_config,
    summarize_load,
    text_sha256,
    tokens_sha256,
)
from dsparkcli.errors import BenchError, ServerError
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.protocol import COMPLETION_FIELDS, SPEC_N_MAX, SpecCounters, completion_payload, timings_drafts
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.outputs import check_output_dir, check_output_file

# Pinned so the templated prompts rendered on the first server stay valid on every later one
# (llama-server otherwise draws a random marker per process).
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class BenchResult:
    run_id: str
    out: Path
    summaries: tuple[dict[str, Any], ...]  # the summary lines as written (with run_id and provenance)
    overhead: OverheadRecord
    synthetic: bool


def render_prompts(client: ServerClient, prompts: Sequence[Prompt]) -> dict[str, str]:
    """Each prompt through the target's chat template, with pinned media markers."""
    rendered = {}
    for p in prompts:
        # thinking off, as in the upstream acceptance measurements; templates without the switch ignore it
        rendered[p.id] = client.apply_template(p.messages(), chat_template_kwargs={"enable_thinking": False})
    return rendered


def _payload(plan: BenchPlan, rendered: str, images_b64: list[str]) -> dict[str, Any]:
    prompt: Any = {"prompt_string": rendered, "multimodal_data": images_b64} if images_b64 else rendered
    return completion_payload(
        prompt, n_predict=plan.n_predict, seed=plan.seed, ignore_eos=plan.ignore_eos, response_fields=COMPLETION_FIELDS
    )


class _Writer:
    """Appends one JSON line per record and flushes it: an interrupted bench keeps every finished line.

    The provenance block (file sha256s: ~20 s for a 20 GB target the first time) is computed in a thread
    while the first configuration loads and runs; records wait in ``pending`` until it is ready, and
    ``flush(wait=True)`` (end of run, or interruption) writes them all with it.
    """

    def __init__(self, fh: TextIO, run_id: str, provenance_block: concurrent.futures.Future[dict[str, Any]]) -> None:
        self.fh, self.run_id, self.provenance = fh, run_id, provenance_block
        self.summaries: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.waited_s = 0.0  # time the bench sat waiting for the hashes (counts as overhead)

    def write(self, rec: dict[str, Any]) -> dict[str, Any]:
        full = {**rec, "run_id": self.run_id}
        if full["record"] in ("summary", "load_summary"):
            self.summaries.append(full)
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


def summaries_so_far(out: Path, run_id: str, upstream: Sequence[tuple[str, float]] = ()) -> list[dict[str, Any]]:
    """The summary rows of what an interrupted run measured: rebuilt from its request and counters
    records in ``out`` (a configuration cut short is summarised over the requests it finished)."""
    records = read_jsonl(out, run_id) if out.is_file() else []
    prov = next((r["provenance"] for r in records if r.get("provenance")), None)
    return [
        {**row, "run_id": run_id, **({"provenance": prov} if prov else {})}
        for row in summarize(records, dict(upstream))
    ]


def default_out_path(run_id: str) -> Path:
    return config.cache_dir() / "bench" / f"bench-{run_id}.jsonl"


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


@dataclass
class _Totals:
    """Running sums for the overhead record."""

    generation_s: float = 0.0  # server-side prompt + generation time (timings)
    request_s: float = 0.0  # client-side round trips of the same requests
    load_s: float = 0.0  # time to healthy, per configuration
    stop_s: float = 0.0  # server shutdown (freeing a large model's memory is not free)


@dataclass
class _RunState:
    """What later configurations need from earlier ones: plain outputs, plain's medians, the rendered prompts."""

    rendered: dict[str, str] | None = None
    # keyed (prompt, rep), or (prompt, rep, concurrency, client) in a --concurrency run
    plain_tokens: dict[tuple[Any, ...], tuple[int, ...]] = field(default_factory=dict)
    plain_sha: dict[tuple[Any, ...], str] = field(default_factory=dict)
    plain_median: dict[str, float | None] = field(default_factory=dict)
    plain_load_tok_s: dict[int, float | None] = field(default_factory=dict)  # concurrency -> aggregate median


@dataclass
class _ArmRecords:
    """One configuration's own measurements: all its summary needs."""

    requests: list[RequestRecord] = field(default_factory=list)
    counters: list[CountersRecord] = field(default_factory=list)
    passes: list[PassRecord] = field(default_factory=list)


def _timed_completion(client: ServerClient, payload: dict[str, Any], totals: _Totals) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    resp = client.completion(payload)
    request_ms = 1000.0 * (time.perf_counter() - t0)
    t = resp.get("timings") or {}
    totals.request_s += request_ms / 1000.0
    totals.generation_s += (t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0)) / 1000.0
    return resp, request_ms


def _request_record(
    plan: BenchPlan,
    arm: Arm,
    p: Prompt,
    rep: int,
    resp: dict[str, Any],
    request_ms: float,
    server_argv: Sequence[str],
    state: _RunState,
    answer: load.Answer[Prompt] | None = None,
    concurrency: int | None = None,
) -> RequestRecord:
    t = resp.get("timings") or {}
    tokens = tuple(int(x) for x in resp.get("tokens") or [])
    output_sha = text_sha256(str(resp.get("content", "")))
    key: tuple[Any, ...] = (p.id, rep) if answer is None else (p.id, rep, concurrency, answer.client)
    identity = None
    if arm.plain:
        state.plain_tokens[key] = tokens
        state.plain_sha[key] = output_sha
    elif key in state.plain_tokens:  # a plan without plain decoding has nothing to compare with
        div = first_divergence(state.plain_tokens[key], tokens)
        identity = Identity(identical_to_plain=div is None, first_divergence=div, plain_sha256=state.plain_sha[key])
    draft_n, draft_n_accepted = timings_drafts(t)
    synth = arm.synth_mean(plan)
    return RequestRecord(
        config=arm.name,
        draft=arm.draft_label,
        budget=arm.budget,
        synthetic=plan.synthetic,
        synth_len=synth,
        category=p.category,
        prompt_id=p.id,
        rep=rep,
        prompt_n=int(resp.get("tokens_evaluated", t.get("prompt_n", 0))),
        prompt_ms=t.get("prompt_ms"),
        n_predicted=int(t.get("predicted_n", len(tokens))),
        predicted_ms=float(t.get("predicted_ms", 0.0)),
        tok_s=t.get("predicted_per_second"),
        request_ms=request_ms,
        draft_n=draft_n,
        draft_n_accepted=draft_n_accepted,
        stop_type=resp.get("stop_type"),
        truncated=resp.get("truncated"),
        tokens=tokens,
        tokens_sha256=tokens_sha256(tokens),
        output_sha256=output_sha,
        server_argv=tuple(server_argv),
        identity=identity,
        concurrency=concurrency,
        client=answer.client if answer else None,
        ttft_ms=answer.ttft_ms if answer else None,
    )


def _server_config(plan: BenchPlan, arm: Arm, concurrency: int = 1) -> ServerConfig:
    return plan.server_config(arm, concurrency)


def _render_once(
    client: ServerClient, plan: BenchPlan, state: _RunState, writer: _Writer, image_sha: dict[str, list[str]]
) -> dict[str, str]:
    """Same target, same template: prompts are rendered once, on the first server, and recorded."""
    if state.rendered is None:
        state.rendered = render_prompts(client, plan.prompts)
        for p in plan.prompts:
            writer.write(
                PromptRecord(p.id, p.category, state.rendered[p.id], tuple(image_sha[p.id]), MEDIA_MARKER).to_record()
            )
    return state.rendered


_T = TypeVar("_T")


def _surviving(srv: LlamaServer, where: str, send: Callable[[], _T]) -> _T:
    """One request, told apart when its connection drops: if llama-server died, the error says how
    (exit status, its log's key line: "llama-server failed during generation (signal 11, SIGSEGV): ...");
    if it is alive, it dropped just this connection (seen under load: a stream ended without a
    response), and the request is sent once more on a fresh connection. A second drop is an error."""
    try:
        return send()
    except ServerError as e:
        if e.kind != "crash":
            raise
        srv.check_alive(during=f"generation ({where})", wait=15.0)
        try:
            return send()
        except ServerError as e2:
            if e2.kind == "crash":
                srv.check_alive(during=f"generation ({where})", wait=15.0)
                raise ServerError(
                    f"llama-server dropped a {where} request twice (it is still running)",
                    kind="crash",
                    log_tail=srv.log_tail(),
                    hint=f"log: {srv.log_path}",
                ) from e2
            raise


def _model_drafts(arm: Arm) -> bool:
    """A draft model runs (a DSpark or classic draft), which must draft: not n-gram speculation."""
    return arm.draft is not None


def _drafted_nothing(arm: Arm, requests: int, srv: LlamaServer) -> BenchError:
    return BenchError(
        f"configuration {arm.name} drafted nothing in {requests} requests "
        f"(check that the draft fits the target, --p-min, --spec-draft-n-min)",
        hint=f"server log: {srv.log_path}",
    )


def _run_arm(
    pool: ServerPool,
    plan_host: ServerConfig,
    plan: BenchPlan,
    arm: Arm,
    writer: _Writer,
    state: _RunState,
    totals: _Totals,
    images_b64: dict[str, list[str]],
    image_sha: dict[str, list[str]],
    categories: list[str],
    on_request: Callable[[str, str], None] | None,
    rep0: int = 0,
) -> tuple[float, _ArmRecords]:
    """One configuration: its server from the pool (started, or a loaded one that can serve it), warm up,
    run every rep × category × prompt (reps numbered from ``rep0``: a later round's). Returns (load
    seconds, 0 on a reused server; its records)."""
    is_draft = arm.speculates  # a server that drafts has counters to read
    mine = _ArmRecords()
    held, draft_fields = pool.acquire(_server_config(plan, arm), plan_host)
    srv = held.server
    # the pool stops the server: after this arm (bench), or when the next one cannot use it (tune)
    load_s = held.load_s if held.uses == 1 else 0.0  # a reused server's load was paid by an earlier arm
    totals.load_s += load_s
    client = srv.client
    assert client is not None
    server_argv = srv.argv
    rendered = _render_once(client, plan, state, writer, image_sha)

    def fields(p: Prompt) -> dict[str, Any]:  # a shared server's budget, or the prompt's category's (auto)
        return {**draft_fields, **arm.request_fields(p.category)}

    def request(p: Prompt) -> tuple[dict[str, Any], float]:
        result = _surviving(
            srv,
            arm.name,
            lambda: _timed_completion(
                client, {**_payload(plan, rendered[p.id], images_b64[p.id]), **fields(p)}, totals
            ),
        )
        if on_request:
            on_request(arm.name, p.id)
        return result

    for i in range(plan.warmup):  # untimed: first-use allocations, caches, page-ins
        request(plan.prompts[i % len(plan.prompts)])

    drafted = 0
    # counters only move while a request runs, so each block's "after" is the next one's "before"
    before = SpecCounters.from_metrics(client.metrics()) if is_draft else None
    for rep in range(rep0, rep0 + plan.reps):
        for category in categories:
            for p in (q for q in plan.prompts if q.category == category):
                resp, request_ms = request(p)
                rec = _request_record(plan, arm, p, rep, resp, request_ms, server_argv, state)
                if SPEC_N_MAX in fields(p):
                    rec = replace(rec, request_n_max=fields(p)[SPEC_N_MAX])
                mine.requests.append(rec)
                writer.write(rec.to_record())
            if before is not None:
                after = SpecCounters.from_metrics(client.metrics())
                block = CountersRecord(
                    config=arm.name,
                    category=category,
                    rep=rep,
                    counters=after.minus(before),
                    draft=arm.draft_label,
                    budget=arm.budget,
                    synthetic=plan.synthetic,
                    server_argv=tuple(server_argv),
                )
                before = after
                drafted += block.counters.drafted
                mine.counters.append(block)
                writer.write(block.to_record())
        # a whole pass without one draft: fail now, not in an hour (an adaptive budget may choose that, and
        # n-gram speculation finds nothing to draft in text that does not repeat itself: its row says 0)
        if is_draft and drafted == 0 and not arm.adaptive and _model_drafts(arm):
            raise _drafted_nothing(arm, len(plan.prompts) * (rep - rep0 + 1), srv)
    return load_s, mine


def _run_load_arm(
    engine: Engine,
    plan: BenchPlan,
    arm: Arm,
    concurrency: int,
    writer: _Writer,
    state: _RunState,
    totals: _Totals,
    images_b64: dict[str, list[str]],
    image_sha: dict[str, list[str]],
    on_request: Callable[[str, str], None] | None,
) -> tuple[float, _ArmRecords]:
    """One configuration at one concurrency: a server with -np N, a warm-up pass, then ``reps`` passes in
    which each of the N clients streams the whole kit (from its own starting prompt). Returns (load s, records)."""
    is_draft = arm.speculates  # a server that drafts has counters to read
    mine = _ArmRecords()
    srv = LlamaServer(engine, _server_config(plan, arm, concurrency), env={"LLAMA_MEDIA_MARKER": MEDIA_MARKER})
    t_load0 = time.perf_counter()
    with srv:
        load_s = time.perf_counter() - t_load0
        totals.load_s += load_s
        assert srv.client is not None
        server_argv = srv.argv
        rendered = _render_once(srv.client, plan, state, writer, image_sha)
        clients = [ServerClient(srv.url, api_key=srv.config.api_key) for _ in range(concurrency)]

        def send(c: ServerClient, p: Prompt) -> tuple[dict[str, Any], float | None, float]:
            result = _surviving(
                srv,
                f"{arm.name} x{concurrency}",
                lambda: load.stream_completion(c, _payload(plan, rendered[p.id], images_b64[p.id])),
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
                    rec = _request_record(
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
                    if sum(c.counters.drafted for c in mine.counters) == 0 and not arm.adaptive and _model_drafts(arm):
                        raise _drafted_nothing(arm, len(mine.requests), srv)
        finally:
            for c in clients:
                c.close()
        t_stop0 = time.perf_counter()
    totals.stop_s += time.perf_counter() - t_stop0
    return load_s, mine


def _joined(earlier: _ArmRecords | None, later: _ArmRecords) -> _ArmRecords:
    if earlier is None:
        return later
    return _ArmRecords(
        earlier.requests + later.requests, earlier.counters + later.counters, earlier.passes + later.passes
    )


def _summaries(
    arm: Arm, mine: _ArmRecords, categories: list[str], state: _RunState, upstream: dict[str, float], load_s: float
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
    totals, state = _Totals(), _RunState()
    with open(out, "a", encoding="utf-8") as fh:
        writer = _Writer(fh, run_id, prov)
        try:
            for concurrency in plan.concurrency:  # plain first at every level: the drafts' speedups need it
                for arm in plan.arms():
                    load_s, mine = _run_load_arm(
                        engine, plan, arm, concurrency, writer, state, totals, images_b64, image_sha, on_request
                    )
                    row = summarize_load(
                        mine.requests, mine.counters, mine.passes, state.plain_load_tok_s.get(concurrency)
                    )
                    if row is not None:
                        if arm.name == PLAIN:
                            state.plain_load_tok_s[concurrency] = row.tok_s.median
                        writer.write(replace(row, load_s=load_s).to_record())
            single = plan.arms() if not plan.concurrency else []
            configs = [_server_config(plan, a) for a in single]
            mine_pool = pool or new_pool(engine, share=False)
            try:
                kept: dict[str, _ArmRecords] = {}  # every round's records of a configuration
                first_load: dict[str, float] = {}
                for rnd in range(plan.rounds):
                    for arm, host in zip(single, plan_hosts(configs) if mine_pool.share else configs):
                        load_s, mine = _run_arm(
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
        run_id=run_id, out=out, summaries=tuple(writer.summaries), overhead=overhead, synthetic=plan.synthetic
    )
