"""One `dspark bench` request, measured: the prompts rendered once through the target's chat template, the
/completion body, the timed round trip, its ``RequestRecord`` (output tokens and hashes, identity vs plain
decoding of the same prompt and rep), and a dropped connection told apart from a dead llama-server.
``RunState`` is what later configurations need from earlier ones (plain's outputs and medians).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dsparkcli.bench import load
from dsparkcli.bench.plan import Arm, BenchPlan
from dsparkcli.bench.prompts import Prompt
from dsparkcli.bench.records import Identity, PromptRecord, RequestRecord
from dsparkcli.bench.stats import first_divergence, text_sha256, tokens_sha256
from dsparkcli.bench.writer import RecordWriter
from dsparkcli.errors import ServerError
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.protocol import COMPLETION_FIELDS, completion_payload, timings_drafts
from dsparkcli.llama.server import LlamaServer

# Pinned so the templated prompts rendered on the first server stay valid on every later one
# (llama-server otherwise draws a random marker per process).
MEDIA_MARKER = "<__media__>"


def render_prompts(client: ServerClient, prompts: Sequence[Prompt]) -> dict[str, str]:
    """Each prompt through the target's chat template, with pinned media markers."""
    rendered = {}
    for p in prompts:
        # thinking off, as in the upstream acceptance measurements; templates without the switch ignore it
        rendered[p.id] = client.apply_template(p.messages(), chat_template_kwargs={"enable_thinking": False})
    return rendered


def completion_body(plan: BenchPlan, rendered: str, images_b64: list[str]) -> dict[str, Any]:
    prompt: Any = {"prompt_string": rendered, "multimodal_data": images_b64} if images_b64 else rendered
    return completion_payload(
        prompt, n_predict=plan.n_predict, seed=plan.seed, ignore_eos=plan.ignore_eos, response_fields=COMPLETION_FIELDS
    )


@dataclass
class Totals:
    """Running sums for the overhead record."""

    generation_s: float = 0.0  # server-side prompt + generation time (timings)
    request_s: float = 0.0  # client-side round trips of the same requests
    load_s: float = 0.0  # time to healthy, per configuration
    stop_s: float = 0.0  # server shutdown (freeing a large model's memory is not free)


@dataclass
class RunState:
    """What later configurations need from earlier ones: plain outputs, plain's medians, the rendered prompts."""

    rendered: dict[str, str] | None = None
    # keyed (prompt, rep), or (prompt, rep, concurrency, client) in a --concurrency run
    plain_tokens: dict[tuple[Any, ...], tuple[int, ...]] = field(default_factory=dict)
    plain_sha: dict[tuple[Any, ...], str] = field(default_factory=dict)
    plain_median: dict[str, float | None] = field(default_factory=dict)
    plain_load_tok_s: dict[int, float | None] = field(default_factory=dict)  # concurrency -> aggregate median


def timed_completion(client: ServerClient, payload: dict[str, Any], totals: Totals) -> tuple[dict[str, Any], float]:
    t0 = time.perf_counter()
    resp = client.completion(payload)
    request_ms = 1000.0 * (time.perf_counter() - t0)
    t = resp.get("timings") or {}
    totals.request_s += request_ms / 1000.0
    totals.generation_s += (t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0)) / 1000.0
    return resp, request_ms


def request_record(
    plan: BenchPlan,
    arm: Arm,
    p: Prompt,
    rep: int,
    resp: dict[str, Any],
    request_ms: float,
    server_argv: Sequence[str],
    state: RunState,
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


def render_once(
    client: ServerClient, plan: BenchPlan, state: RunState, writer: RecordWriter, image_sha: dict[str, list[str]]
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


def surviving(srv: LlamaServer, where: str, send: Callable[[], _T]) -> _T:
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
