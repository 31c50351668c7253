"""The `run` job: from a model name or local files to a streamed answer with acceptance statistics.

Flow: validate images (Pillow) into a ``Question`` → ``pairs.prepare_server`` (registry + hub, or local
paths / hf:// refs; pairing checked from headers before anything is launched) → LlamaServer with mmproj
+ draft (or a running server) → one streamed /v1/chat/completions request → RunResult with timings and
acceptance. The CLI builds the frozen inputs and calls ``answer``; ``run(**options)`` is the Python API.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dsparkcli.budget.choice import Want, chosen_server
from dsparkcli.budget.limits import ADAPTIVE, AUTO
from dsparkcli.errors import ServerError, UsageError
from dsparkcli.gguf.pairing import acceptance_kind
from dsparkcli.hub.fetch import Confirm
from dsparkcli.images import ImageInput, load_image
from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama import placement as placement_mod
from dsparkcli.llama import protocol
from dsparkcli.llama.client import ServerClient, metrics_or_none, stream_chat
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.placement import Placement
from dsparkcli.llama.server import LlamaServer
from dsparkcli.pairs import Downloads, PairSpec, ServerKnobs, check_given, check_plain, prepare_server
from dsparkcli.plaincheck import PlainComparison, compare_with_plain


@dataclass(frozen=True)
class Acceptance:
    drafted: int
    accepted: int
    steps: int | None  # verification steps (from /metrics); None when the server has no metrics

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_len(self) -> float | None:
        """Mean acceptance length (protocol.mean_acceptance_length); None without /metrics."""
        return protocol.mean_acceptance_length(self.accepted, self.steps) if self.steps is not None else None


@dataclass(frozen=True)
class RunResult:
    text: str
    n_tokens: int
    prompt_tokens: int
    decode_tok_s: float
    prompt_tok_s: float
    ttft_s: float  # client-side: request sent → first content byte
    wall_s: float  # client-side: request sent → stream closed
    acceptance: Acceptance | None  # None for plain decoding
    finish_reason: str | None
    timings: dict[str, Any]
    budget: int | None
    server_argv: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    acceptance_kind: str | None = None  # "REAL" or "SYNTHETIC (why)" for a drafted run; None without a draft
    comparison: PlainComparison | None = None  # --compare: the same question to plain decoding

    def to_record(self) -> dict[str, Any]:
        acc = self.acceptance
        return {
            "text": self.text,
            "n_tokens": self.n_tokens,
            "prompt_tokens": self.prompt_tokens,
            "decode_tok_s": self.decode_tok_s,
            "prompt_tok_s": self.prompt_tok_s,
            "ttft_s": self.ttft_s,
            "wall_s": self.wall_s,
            "budget": self.budget,
            "drafted": acc.drafted if acc else None,
            "accepted": acc.accepted if acc else None,
            "steps": acc.steps if acc else None,
            "acceptance_rate": acc.rate if acc else None,
            "mean_acceptance_length": acc.mean_len if acc else None,
            "acceptance_kind": self.acceptance_kind,
            "finish_reason": self.finish_reason,
            "timings": self.timings,
            "server_argv": list(self.server_argv),
            "files": self.files,
            "comparison": self.comparison.to_record() if self.comparison else None,
        }


def _result(
    text: str,
    timings: dict[str, Any],
    finish: str | None,
    ttft: float,
    wall: float,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    *,
    drafting: bool,
    budget: int | None,
    argv: Sequence[str] = (),
    files: dict[str, str] | None = None,
) -> RunResult:
    acceptance = None
    if drafting:
        steps = None
        if before is not None and after is not None:
            steps = protocol.SpecCounters.from_metrics(after).minus(protocol.SpecCounters.from_metrics(before)).steps
        drafted, accepted = protocol.timings_drafts(timings)
        acceptance = Acceptance(drafted=drafted, accepted=accepted, steps=steps)
    return RunResult(
        text=text,
        n_tokens=int(timings.get("predicted_n", 0)),
        prompt_tokens=int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0)),
        decode_tok_s=float(timings.get("predicted_per_second", 0.0)),
        prompt_tok_s=float(timings.get("prompt_per_second", 0.0)),
        ttft_s=ttft,
        wall_s=wall,
        acceptance=acceptance,
        finish_reason=finish,
        timings=dict(timings),
        budget=budget,
        server_argv=tuple(argv),
        files=files or {},
    )


def ask(
    client: ServerClient,
    prompt: str,
    images: Sequence[ImageInput] = (),
    *,
    system: str | None = None,
    max_tokens: int = 256,
    temp: float = 0.0,
    seed: int | None = None,
    drafting: bool | None = None,
    budget: int | None = None,
    on_text: Callable[[str], None] | None = None,
    argv: Sequence[str] = (),
    files: dict[str, str] | None = None,
    draft: dict[str, Any] | None = None,
) -> RunResult:
    """One question to a running server, with acceptance read from its timings and /metrics.

    ``drafting``: True/False when we started the server; None for a user's server (inferred from its answer).
    ``draft``: the request's own draft settings (``protocol.draft_settings``).
    """
    payload = protocol.chat_payload(
        protocol.build_messages(prompt, [im.data_url for im in images], system),
        max_tokens=max_tokens,
        temp=temp,
        seed=seed,
        draft=draft,
    )
    before = metrics_or_none(client) if drafting is not False else None
    text, timings, finish, ttft, wall = stream_chat(client, payload, on_text=on_text)
    after = metrics_or_none(client) if drafting is not False else None
    if drafting is None:
        steps_moved = (
            before is not None
            and after is not None
            and protocol.SpecCounters.from_metrics(after).steps > protocol.SpecCounters.from_metrics(before).steps
        )
        drafting = "draft_n" in timings or steps_moved
    return _result(
        text, timings, finish, ttft, wall, before, after, drafting=drafting, budget=budget, argv=argv, files=files
    )


def require_request_drafts(client: ServerClient) -> None:
    """A stock llama-server ignores a request's draft settings silently: refuse before asking."""
    settings = client.props().get("default_generation_settings") or {}
    if protocol.SPEC_N_MAX not in (settings.get("params") or settings):
        raise UsageError(
            "this server ignores a request's --budget/--p-min/--no-draft (a stock llama.cpp): restart "
            "it with them, or serve it with dspark's patched engine (dspark engine build)"
        )


def request_budget(client: ServerClient, budget: int | None, *, adaptive: bool = False) -> int | str | None:
    """The budget a request to a running server drafts with: its own ``budget`` when the server allows it,
    else the server's (AUTO when it chooses per step); None when the server says nothing (a stock engine, or
    no draft). A budget above the server's is refused in one line before anything is sent: dspark's
    patched llama-server would cap it at its own and echo the one asked for (patch 0001)."""
    try:
        answer = client.completion(dict(protocol.SETTINGS_PROBE))
    except ServerError as e:
        if e.kind != "http":  # nothing listens there: the same error the question would get
            raise
        answer = {}  # a server that refuses the empty request says nothing of its budget
    served = protocol.ServedBudget.from_settings(answer.get("generation_settings") or {})
    if served is None:
        return budget
    if budget is not None and budget > served.n_max:
        raise UsageError(
            f"--budget {budget} is above this server's budget {served.n_max} (its --spec-draft-n-max): "
            f"llama-server would draft at most {served.n_max}; ask for at most {served.n_max}, or "
            f"serve with --budget {budget}"
        )
    if adaptive:
        return protocol.AUTO
    return budget if budget is not None else protocol.AUTO if served.auto else served.n_max


@dataclass(frozen=True)
class Question:
    """What is asked: the prompt, its images (validated) and the sampling settings."""

    prompt: str
    images: tuple[ImageInput, ...] = ()
    system: str | None = None
    max_tokens: int = 256
    temp: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt.strip():  # before any model is loaded
            raise UsageError("the prompt is empty")


def answer(
    question: Question,
    pair: PairSpec,
    knobs: ServerKnobs,
    downloads: Downloads = Downloads(),
    *,
    server_url: str | None = None,
    engine: Engine | None = None,
    llama_bin: str | None = None,
    on_text: Callable[[str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_server: Callable[[LlamaServer], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    compare: bool = False,
) -> RunResult:
    """The `run` job: ask a running server (``server_url``), or start one for the pair and ask it.
    ``on_notice`` gets the one line saying which tuning ``--budget auto`` used, or that a server asked with
    ``--budget adaptive`` has no draft (default: ``on_status``).
    ``compare``: then ask plain decoding the same question (a second load, without the draft) and say
    where the answers part, with the target's top-2 there (plaincheck)."""
    q = question
    check_plain(pair, knobs)
    if compare:
        if server_url:
            raise UsageError("--compare starts its own servers (with and without the draft): drop --server")
        if pair.no_draft:
            raise UsageError("--compare compares the draft with plain decoding: drop --no-draft")
        if q.temp > 0:
            raise UsageError("--compare needs greedy decoding (--temp 0): sampled answers differ by design")
    if server_url:
        fixed = _set_at_start(pair, knobs)
        if fixed:  # they choose what a server loads and how: a running one has made those choices already
            raise UsageError(
                f"{', '.join(fixed)}: set when a server starts, so they cannot apply to --server "
                f"{server_url[:100]}; drop them, or give them to `dspark serve` and ask that server"
            )
        where = urlsplit(server_url)
        if where.scheme not in ("http", "https") or not where.netloc:
            raise UsageError(f"--server takes a URL such as http://127.0.0.1:8080 (got {server_url[:100]!r})")
        # this request's own draft settings (dspark's patched llama-server honours them, capped at its budget)
        draft = protocol.draft_settings(
            n_max=0 if pair.no_draft else protocol.AUTO if knobs.adaptive_budget else knobs.budget, p_min=knobs.p_min
        )
        client = ServerClient(server_url, api_key=knobs.api_key)
        try:
            if draft:
                require_request_drafts(client)
            budget = None if pair.no_draft else request_budget(client, knobs.budget, adaptive=knobs.adaptive_budget)
            if knobs.adaptive_budget and budget is None:
                # "auto" asks the server's per-step choice; a server with no draft has none to make (serve
                # --budget adaptive leaves the draft out where no k can pay): the request decodes as it serves
                draft = {k: v for k, v in draft.items() if k != protocol.SPEC_N_MAX}
                if on_notice or on_status:
                    (on_notice or on_status)(  # type: ignore[misc]
                        "--budget adaptive: this server runs without a draft, so the request decodes plainly"
                    )
            return ask(
                client,
                q.prompt,
                q.images,
                system=q.system,
                max_tokens=q.max_tokens,
                temp=q.temp,
                seed=q.seed,
                drafting=None,
                budget=budget,
                on_text=on_text,
                draft=draft,
            )
        finally:
            client.close()

    check_given(pair, need_vision=bool(q.images))  # a typo is said before "no engine found"
    eng = engine or engine_mod.resolve_engine(llama_bin, rpc=bool(knobs.placement.rpc))
    cfg, files = prepare_server(pair, knobs, downloads, need_vision=bool(q.images), engine=eng)
    cfg, auto = chosen_server(
        eng,
        cfg,
        Want(
            budget=knobs.auto_budget, p_min=knobs.auto_p_min, adaptive=knobs.adaptive_budget, category=knobs.category
        ),
    )
    if auto is not None and (on_notice or on_status):
        (on_notice or on_status)(auto.message)  # type: ignore[misc]
    if auto is not None and auto.without_draft:
        if compare:
            raise UsageError(
                f"--compare --budget {ADAPTIVE if knobs.adaptive_budget else AUTO}: this tuning leaves "
                "no draft worth loading (above); compare a fixed budget with --budget N"
            )
        files = replace(files, draft=None)
    n_max = cfg.n_max
    if on_status:
        on_status(
            f"loading {files.target.name}" + (f" + draft {files.draft.name} (budget {n_max})" if files.draft else "")
        )
        if cfg.placement.rpc:
            on_status(placement_mod.describe(cfg.placement))
    with LlamaServer(eng, cfg) as srv:
        if on_server:
            on_server(srv)
        assert srv.client is not None
        try:
            result = ask(
                srv.client,
                q.prompt,
                q.images,
                system=q.system,
                max_tokens=q.max_tokens,
                temp=q.temp,
                seed=q.seed,
                drafting=cfg.speculates,
                budget=n_max,
                on_text=on_text,
                argv=srv.argv,
                files=files.by_role(),
            )
        except ServerError as e:
            # a crash mid-generation becomes "llama-server failed during generation: ..."; a dropped
            # connection (kind crash) waits for the process to finish dying, an HTTP error does not
            srv.check_alive(wait=15.0 if e.kind == "crash" else 0.0)
            raise
    if files.draft is None:
        if compare:
            raise UsageError("--compare needs a draft: this pair has none")
        return result
    kind = acceptance_kind(files.target, files.draft)
    result = replace(result, acceptance_kind=kind.label if kind.label == "REAL" else f"{kind.label} ({kind.why})")
    if compare:
        if on_status:
            on_status(f"plain decoding of the same question (loading {files.target.name} without the draft)")
        messages = protocol.build_messages(q.prompt, [im.data_url for im in q.images], q.system)
        result = replace(
            result,
            comparison=compare_with_plain(eng, cfg, messages, result.text, max_tokens=q.max_tokens, seed=q.seed),
        )
    return result


def _set_at_start(pair: PairSpec, knobs: ServerKnobs) -> list[str]:
    """The options given that only a server's start can use (their CLI names, in the order of `--help`).
    --budget N|adaptive, --p-min P and --no-draft are the request's own (dspark's patched llama-server)."""
    given = {
        "--model": pair.model,
        "--target": pair.target,
        "--draft": pair.draft,
        "--mmproj": pair.mmproj,
        "--draft-key": pair.draft_key,
        "--spec": pair.speculation,
        "--budget auto": knobs.auto_budget,
        "--p-min auto": knobs.auto_p_min,
        "--category": knobs.category,
        "--ctx": knobs.ctx,
        "--threads": knobs.threads,
        "--ngl": knobs.ngl,
        "--rpc/--split-mode/--tensor-split/--main-gpu/--draft-device": knobs.placement != Placement(),
        "arguments after --": knobs.extra_args,
    }
    return [flag for flag, value in given.items() if value not in (None, False, ())]


def run(
    prompt: str,
    images: Sequence[str | Path] = (),
    *,
    model: str | None = None,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    mmproj: str | Path | None = None,
    draft_key: str | None = None,
    budget: int | str | None = None,
    no_draft: bool = False,
    p_min: float | str | None = None,
    category: str | None = None,
    max_tokens: int = 256,
    temp: float = 0.0,
    seed: int | None = None,
    ctx: int | None = None,
    system: str | None = None,
    extra_args: Sequence[str] = (),
    server_url: str | None = None,
    api_key: str | None = None,
    engine: Engine | None = None,
    llama_bin: str | None = None,
    threads: int | None = None,
    ngl: str | int | None = None,
    placement: Placement = Placement(),
    yes: bool = False,
    confirm: Confirm | None = None,
    on_text: Callable[[str], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    on_server: Callable[[LlamaServer], None] | None = None,
    on_progress: Callable[..., None] | None = None,
) -> RunResult:
    """Answer one prompt (with images) through DSpark speculative decoding: the Python API of `dspark run`
    (``dsparkcli.run``). Keyword arguments as the CLI's options (``budget="auto"``, ``p_min="auto"``: the
    stored tuning); see ``answer``."""
    question = Question(
        prompt, tuple(load_image(p) for p in images), system=system, max_tokens=max_tokens, temp=temp, seed=seed
    )
    return answer(
        question,
        PairSpec(model=model, target=target, draft=draft, mmproj=mmproj, draft_key=draft_key, no_draft=no_draft),
        ServerKnobs(
            budget=None if budget in (AUTO, ADAPTIVE) else budget,  # type: ignore[arg-type]
            p_min=None if p_min == AUTO else p_min,  # type: ignore[arg-type]
            adaptive_budget=budget == ADAPTIVE,
            ctx=ctx,
            threads=threads,
            ngl=ngl,
            extra_args=tuple(extra_args),
            api_key=api_key,
            auto_budget=budget == AUTO,
            auto_p_min=p_min == AUTO,
            category=category,
            placement=placement,
        ),
        Downloads(yes=yes, confirm=confirm, on_progress=on_progress),
        server_url=server_url,
        engine=engine,
        llama_bin=llama_bin,
        on_text=on_text,
        on_status=on_status,
        on_server=on_server,
    )
