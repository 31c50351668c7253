"""n-gram speculation drafts on dspark's patched engine exactly as on stock llama.cpp (issue 34).

Patch 0001 used to cap every speculation type's draft at the request's speculative.n_max (default
--spec-draft-n-max, 3): ngram-mod never drafted more than 3 tokens a step. Now the request's cap (and 0002's
adaptive k) applies to draft models only. On a known-answer target whose greedy answer follows a cycle the
prompt already holds, n-gram lookup finds every continuation: the same settings give the same drafted and
accepted counts on the patched engine and on a stock build of the same commit, drafts longer than 3, and a
request's speculative.n_max does not shorten them. The DSpark side of the cap keeps its known-answer tests
(tests/test_adaptive.py). Real binaries, -t 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparkcli.llama import engine as engine_mod
from dsparkcli.llama.loads import build_record
from dsparkcli.llama.protocol import SPEC_N_MAX, SpecCounters
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.llama.speculation import parse
from dsparkcli.synth import known_answer as synth

N_PREDICT = 64


@pytest.fixture(scope="module")
def stock(engine) -> engine_mod.Engine:
    """A stock (--no-patches) CPU build of the engine's commit, found by its key in the cache: a failure, not
    a skip, when there is none (`dspark engine build --no-patches` makes it)."""
    # a binary built from a tree without git metadata (the b11549 sdist) does not say its commit: its record does
    commit = engine.commit or (found[1].commit if (found := build_record(engine)) else "")
    builds = [
        r for _, r in engine_mod.cached_builds() if not r.patch_hash and r.backend == "cpu" and r.commit == commit
    ]
    assert builds, "no stock CPU build in the cache: run `dspark engine build --no-patches`"
    server = Path(builds[0].bin_dir) / "llama-server"
    return engine_mod.Engine(
        server=server, bin_dir=server.parent, source="cache", commit=builds[0].commit, backend="cpu"
    )


@pytest.fixture(scope="module")
def cyclic(tmp_path_factory) -> tuple[Path, list[int]]:
    """The known-answer target and a prompt of 160 tokens that follow its greedy map g: the answer continues
    the same cycle, so every n-gram of it is in the prompt."""
    pair = synth.write_pair(tmp_path_factory.mktemp("ngram"), accept_rate=1.0, seed=7)
    g = synth.load_manifest(pair.manifest).g
    prompt, t = [], 3
    for _ in range(160):
        prompt.append(t)
        t = g[t]
    return pair.target, prompt


def drafts(
    eng: engine_mod.Engine, target: Path, prompt: list[int], spec: str, request: dict | None = None
) -> tuple[int, int, SpecCounters]:
    """(timings draft_n, draft_n_accepted, /metrics counters) of one greedy request on a fresh server."""
    s = parse(spec)
    cfg = ServerConfig(model=target, spec_type=s.kind, spec_flags=s.flags(), ctx=512, threads=1)
    with LlamaServer(eng, cfg) as srv:
        resp = srv.client.completion(
            {
                "prompt": prompt,
                "n_predict": N_PREDICT,
                "temperature": 0.0,
                "seed": 0,
                "cache_prompt": False,
                **(request or {}),
            }
        )
        counters = SpecCounters.from_metrics(srv.client.metrics())
    t = resp["timings"]
    assert t["predicted_n"] == N_PREDICT
    return int(t["draft_n"]), int(t["draft_n_accepted"]), counters


@pytest.mark.parametrize("spec", ["ngram-mod:n_max=8,n_min=2", "ngram-simple:n_max=16", "ngram-mod"])
def test_ngram_drafts_as_stock_llama_cpp(engine, stock, cyclic, spec) -> None:
    target, prompt = cyclic
    patched = drafts(engine, target, prompt, spec)
    plain = drafts(stock, target, prompt, spec)
    assert patched[:2] == plain[:2]
    assert (patched[2].drafted, patched[2].accepted, patched[2].steps) == (
        plain[2].drafted,
        plain[2].accepted,
        plain[2].steps,
    )
    drafted, accepted, counters = patched
    assert drafted == accepted > 0  # the cycle is in the prompt: every drafted token is the target's
    assert drafted > 3 * counters.steps  # longer than the old cap of --spec-draft-n-max 3 per step


def test_a_request_n_max_does_not_cap_ngram_drafts(engine, cyclic) -> None:
    """speculative.n_max caps a draft model's draft; ngram-mod keeps its own n_max (8 here)."""
    target, prompt = cyclic
    free = drafts(engine, target, prompt, "ngram-mod:n_max=8,n_min=2")
    capped = drafts(engine, target, prompt, "ngram-mod:n_max=8,n_min=2", request={SPEC_N_MAX: 1})
    zero = drafts(engine, target, prompt, "ngram-mod:n_max=8,n_min=2", request={SPEC_N_MAX: 0})
    assert free[:2] == capped[:2] == zero[:2]
    assert free[0] > 3 * free[2].steps
