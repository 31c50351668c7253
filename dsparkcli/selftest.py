"""`dspark doctor --selftest`: does this llama.cpp run DSpark drafts exactly as predicted?

Writes a synthetic known-answer pair (synth.py) into a temporary directory, serves it with the engine's
llama-server and ``--spec-type draft-dspark``, and compares output tokens, ``draft_n``,
``draft_n_accepted`` and the ``/metrics`` counters with synth's prediction. The pair has 30 % wrong
Markov rows, a confidence head and a vision projector, so partial acceptance, the last block's
truncation, ``--spec-draft-p-min`` and an image in a chat request are all exercised. No download.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsparkcli.llama import engine as eng_mod
from dsparkcli.llama import protocol
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.engine import Engine
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth

SEED = 1
ACCEPT_RATE = 0.7
BLOCK_SIZE = 8
CTX = 1024


@dataclass(frozen=True)
class SelftestCheck:
    """One request (or the /metrics scrape) compared with the prediction."""

    name: str
    n_max: int
    p_min: float
    n_predict: int
    expected_draft_n: int
    observed_draft_n: int
    expected_accepted: int
    observed_accepted: int
    tokens_match: bool  # token ids (/completion) or text (chat) equal the prediction
    ok: bool
    detail: str  # what differed; "" when ok


@dataclass(frozen=True)
class SelftestResult:
    ok: bool
    server: str
    backend: str
    commit: str
    seconds: float
    checks: tuple[SelftestCheck, ...]
    log_paths: tuple[str, ...]


def _timings(resp: dict) -> tuple[int, int]:
    return protocol.timings_drafts(resp.get("timings") or {})


def _check(
    name: str,
    pred: synth.Prediction,
    *,
    n_max: int,
    p_min: float,
    n_predict: int,
    draft_n: int,
    accepted: int,
    tokens_match: bool,
) -> SelftestCheck:
    diffs = []
    if not tokens_match:
        diffs.append("output differs")
    if draft_n != pred.draft_n:
        diffs.append(f"draft_n {draft_n} != {pred.draft_n}")
    if accepted != pred.draft_n_accepted:
        diffs.append(f"draft_n_accepted {accepted} != {pred.draft_n_accepted}")
    return SelftestCheck(
        name=name,
        n_max=n_max,
        p_min=p_min,
        n_predict=n_predict,
        expected_draft_n=pred.draft_n,
        observed_draft_n=draft_n,
        expected_accepted=pred.draft_n_accepted,
        observed_accepted=accepted,
        tokens_match=tokens_match,
        ok=not diffs,
        detail="; ".join(diffs),
    )


def _completion(
    client: ServerClient, man: synth.Manifest, prompt: list[int], *, n_max: int, p_min: float, n_predict: int
) -> tuple[SelftestCheck, synth.Prediction]:
    resp = client.completion(protocol.completion_payload(prompt, n_predict=n_predict))
    pred = synth.predict(man, prompt, n_max=n_max, p_min=p_min, n_predict=n_predict)
    draft_n, accepted = _timings(resp)
    check = _check(
        f"completion prompt={','.join(map(str, prompt))}",
        pred,
        n_max=n_max,
        p_min=p_min,
        n_predict=n_predict,
        draft_n=draft_n,
        accepted=accepted,
        tokens_match=list(resp.get("tokens", [])) == list(pred.tokens),
    )
    return check, pred


def _chat_image(
    client: ServerClient, man: synth.Manifest, image: Path, *, n_max: int, p_min: float, n_predict: int
) -> tuple[SelftestCheck, synth.Prediction]:
    url = protocol.image_data_url("image/png", image.read_bytes())
    messages = protocol.build_messages("What is in this image?", [url])
    resp = client.chat({"messages": messages, "temperature": 0, "max_tokens": n_predict})
    # the answer depends on the prompt only through its last token: the text after the image marker
    marker = client.props().get("media_marker")
    templated = client.apply_template(messages)
    last = synth.last_prompt_token(man, templated, marker)
    pred = synth.predict_from_last(man, last, n_max=n_max, p_min=p_min, n_predict=n_predict)
    draft_n, accepted = _timings(resp)
    text = resp["choices"][0]["message"].get("content") or ""
    check = _check(
        "chat with image",
        pred,
        n_max=n_max,
        p_min=p_min,
        n_predict=n_predict,
        draft_n=draft_n,
        accepted=accepted,
        tokens_match=text == pred.text,
    )
    return check, pred


def _metrics_check(client: ServerClient, preds: list[synth.Prediction], n_max: int) -> SelftestCheck:
    m = client.metrics()
    counters = protocol.SpecCounters.from_metrics(m)
    # a counter the server does not expose reads -1 (and a position it lacks None), never a plausible 0
    steps = counters.steps if protocol.M_STEPS in m else -1
    drafted = counters.drafted if protocol.M_DRAFTED in m else -1
    accepted = counters.accepted if protocol.M_ACCEPTED in m else -1
    width = len(counters.accepted_per_pos)
    per_pos = tuple(counters.accepted_per_pos[i] if i < width else None for i in range(min(n_max, BLOCK_SIZE)))
    exp_steps = sum(p.steps for p in preds)
    exp_drafted = sum(p.draft_n for p in preds)
    exp_accepted = sum(p.draft_n_accepted for p in preds)
    exp_per_pos = tuple(sum(col) for col in zip(*(p.accepted_per_pos for p in preds)))
    diffs = []
    if steps != exp_steps:
        diffs.append(f"drafts_total {steps} != {exp_steps}")
    if per_pos != exp_per_pos:
        diffs.append(f"accepted per pos {list(per_pos)} != {list(exp_per_pos)}")
    if drafted != exp_drafted:
        diffs.append(f"draft_tokens_total {drafted} != {exp_drafted}")
    if accepted != exp_accepted:
        diffs.append(f"accepted_tokens_total {accepted} != {exp_accepted}")
    return SelftestCheck(
        name=f"/metrics after {len(preds)} requests",
        n_max=n_max,
        p_min=0.0,
        n_predict=0,
        expected_draft_n=exp_drafted,
        observed_draft_n=drafted,
        expected_accepted=exp_accepted,
        observed_accepted=accepted,
        tokens_match=True,
        ok=not diffs,
        detail="; ".join(diffs),
    )


def run_selftest(
    llama_bin: str | None = None,
    *,
    engine: Engine | None = None,
    threads: int | None = 1,
    on_check: Callable[[SelftestCheck], None] | None = None,
) -> SelftestResult:
    """Run the known-answer checks on the engine's llama-server. Raises ServerError if it cannot start.

    One thread is plenty for these tiny models, and on a busy CPU it is much faster than two: llama.cpp's
    worker threads spin while they wait (measured here under load: 0.4 s with -t 1, 15 s with -t 2).
    """
    eng = engine or eng_mod.describe(eng_mod.resolve_engine(llama_bin))
    start = time.monotonic()
    checks: list[SelftestCheck] = []
    logs: list[str] = []

    def record(check: SelftestCheck) -> None:
        checks.append(check)
        if on_check:
            on_check(check)

    with tempfile.TemporaryDirectory(prefix="dspark-selftest-") as tmp:
        pair = synth.write_pair(
            tmp, accept_rate=ACCEPT_RATE, confidence=True, vision=True, seed=SEED, block_size=BLOCK_SIZE
        )
        man = synth.load_manifest(pair.manifest)

        # 1. full block, image projector loaded: two /completion prompts, a chat with an image, /metrics
        cfg = ServerConfig(
            model=pair.target,
            draft=pair.draft,
            mmproj=pair.mmproj,
            n_max=BLOCK_SIZE,
            p_min=0.0,
            ctx=CTX,
            threads=threads,
        )
        with LlamaServer(eng, cfg, startup_timeout=120) as srv:
            logs.append(str(srv.log_path))
            preds = []
            for prompt, n_predict in (([1, 2, 3], 48), ([77], 29)):
                check, pred = _completion(srv.client, man, prompt, n_max=BLOCK_SIZE, p_min=0.0, n_predict=n_predict)
                record(check)
                preds.append(pred)
            check, pred = _chat_image(srv.client, man, pair.image, n_max=BLOCK_SIZE, p_min=0.0, n_predict=24)
            record(check)
            preds.append(pred)
            record(_metrics_check(srv.client, preds, BLOCK_SIZE))

        # 2. small budget and the confidence head cutting blocks
        cfg = ServerConfig(model=pair.target, draft=pair.draft, n_max=3, p_min=0.5, ctx=CTX, threads=threads)
        with LlamaServer(eng, cfg, startup_timeout=120) as srv:
            logs.append(str(srv.log_path))
            record(_completion(srv.client, man, [1, 2, 3], n_max=3, p_min=0.5, n_predict=32)[0])

    return SelftestResult(
        ok=all(c.ok for c in checks),
        server=str(eng.server),
        backend=eng.backend,
        commit=eng.commit,
        seconds=time.monotonic() - start,
        checks=tuple(checks),
        log_paths=tuple(logs),
    )
