"""The predictor against the real llama-server: tokens, draft_n, draft_n_accepted and /metrics, exactly.

One server per (pair, budget), reused for several prompts; -t 1, -c 1024. Budgets 3, 7 and the block
size 8; accept rates 1.0, 0.7 and 0.3; an image in a chat request; the confidence head with p_min.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama.client import ServerClient
from dsparkcli.llama.server import LlamaServer, ServerConfig
from dsparkcli.synth import known_answer as synth

BLOCK = 8
BUDGETS = (3, 7, BLOCK)
# (prompt ids, n_predict): different last tokens and budgets, so last blocks get cut at different places
PROMPTS = (([1, 2, 3], 40), ([77], 29), ([5, 100, 42], 17), ([126], 3))
M = "llamacpp:spec_decode_num_"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[float, synth.SynthPair]:
    root = tmp_path_factory.mktemp("pairs")
    return {q: synth.write_pair(root / f"q{q}", accept_rate=q, seed=11, block_size=BLOCK) for q in (1.0, 0.7, 0.3)}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


def serve(engine, pair: synth.SynthPair, logs: Path, **kw) -> LlamaServer:
    # -t 1: tiny models, and spinning worker threads make -t 2 far slower on a shared, busy CPU
    cfg = ServerConfig(model=pair.target, draft=pair.draft, ctx=1024, threads=1, **kw)
    return LlamaServer(engine, cfg, log_dir=logs, startup_timeout=60)


def complete(client: ServerClient, prompt: list[int], n_predict: int) -> dict:
    return client.completion({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True})


def observed(resp: dict) -> tuple[int, int]:
    t = resp["timings"]
    return t.get("draft_n", 0), t.get("draft_n_accepted", 0)  # absent when nothing was drafted


def spec_metrics(client: ServerClient, n_pos: int) -> dict:
    m = client.metrics()
    return {
        "steps": m[M + "drafts_total"],
        "drafted": m[M + "draft_tokens_total"],
        "accepted": m[M + "accepted_tokens_total"],
        "per_pos": tuple(m[f'{M}accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(n_pos)),
        "beyond": f'{M}accepted_tokens_per_pos_total{{position="{n_pos}"}}' in m,
    }


def expected_metrics(preds: list[synth.Prediction]) -> dict:
    return {
        "steps": sum(p.steps for p in preds),
        "drafted": sum(p.draft_n for p in preds),
        "accepted": sum(p.draft_n_accepted for p in preds),
        "per_pos": tuple(sum(c) for c in zip(*(p.accepted_per_pos for p in preds))),
        "beyond": False,
    }


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("accept_rate", [1.0, 0.7, 0.3])
def test_completion_matches_prediction(engine, pairs, logs, accept_rate, budget):
    pair = pairs[accept_rate]
    man = synth.load_manifest(pair.manifest)
    preds = []
    with serve(engine, pair, logs, n_max=budget) as srv:
        for prompt, n_predict in PROMPTS:
            resp = complete(srv.client, prompt, n_predict)
            pred = synth.predict(man, prompt, n_max=budget, n_predict=n_predict)
            assert resp["tokens"] == list(pred.tokens), (prompt, n_predict)
            assert resp["content"] == pred.text
            assert observed(resp) == (pred.draft_n, pred.draft_n_accepted), (prompt, n_predict, pred.blocks)
            preds.append(pred)
        assert spec_metrics(srv.client, budget) == expected_metrics(preds)

    drafted = sum(p.draft_n for p in preds)
    accepted = sum(p.draft_n_accepted for p in preds)
    if accept_rate == 1.0:
        assert accepted == drafted > 0
    else:  # wrong rows make acceptance partial, and lower for the lower rate
        assert 0 < accepted < drafted
    # with p_min 0 only the budget shortens a block: the last blocks were cut somewhere
    assert any(d < budget for p in preds for d, _ in p.blocks)
    assert preds[-1].blocks[0][0] == 1  # n_predict 3: the one draft is cut to 3 - 1 - 1 = 1 token


def test_acceptance_falls_with_the_accept_rate(pairs):
    rates = {}
    for q, pair in pairs.items():
        man = synth.load_manifest(pair.manifest)
        preds = [synth.predict_from_last(man, t, n_max=BLOCK, n_predict=64) for t in range(0, 128, 8)]
        rates[q] = sum(p.draft_n_accepted for p in preds) / sum(p.draft_n for p in preds)
    assert rates[1.0] == 1.0 > rates[0.7] > rates[0.3] > 0


def test_budget_above_block_size_is_clamped_like_the_server(engine, pairs, logs):
    pair = pairs[0.7]
    man = synth.load_manifest(pair.manifest)
    with serve(engine, pair, logs, n_max=12) as srv:
        resp = complete(srv.client, [9, 8], 50)
        pred = synth.predict(man, [9, 8], n_max=12, n_predict=50)
        assert pred.n_max == BLOCK and len(pred.accepted_per_pos) == BLOCK
        assert resp["tokens"] == list(pred.tokens)
        assert observed(resp) == (pred.draft_n, pred.draft_n_accepted)
        assert spec_metrics(srv.client, BLOCK) == expected_metrics([pred])  # positions 0..7, no position 8


def test_no_token_ends_generation(engine, pairs, logs):
    # 260 tokens walk g's single cycle through all 128 ids twice (mask id 127 included): no early stop
    pair = pairs[1.0]
    man = synth.load_manifest(pair.manifest)
    with serve(engine, pair, logs, n_max=BLOCK) as srv:
        resp = complete(srv.client, [0], 260)
    pred = synth.predict(man, [0], n_max=BLOCK, n_predict=260)
    assert len(set(pred.tokens)) == 128
    assert resp["tokens"] == list(pred.tokens)
    assert resp["stop_type"] == "limit"
    assert observed(resp) == (pred.draft_n, pred.draft_n_accepted)


# ------------------------------------------------------------------ confidence head


@pytest.fixture(scope="module")
def conf_pair(tmp_path_factory) -> synth.SynthPair:
    return synth.write_pair(tmp_path_factory.mktemp("conf"), accept_rate=0.7, confidence=True, seed=5)


@pytest.mark.parametrize(("budget", "p_min"), [(BLOCK, 0.5), (3, 0.9), (7, 0.1)])
def test_confidence_head_truncates_as_predicted(engine, conf_pair, logs, budget, p_min):
    man = synth.load_manifest(conf_pair.manifest)
    preds = []
    with serve(engine, conf_pair, logs, n_max=budget, p_min=p_min) as srv:
        for prompt, n_predict in PROMPTS[:3]:
            resp = complete(srv.client, prompt, n_predict)
            pred = synth.predict(man, prompt, n_max=budget, n_predict=n_predict, p_min=p_min)
            assert resp["tokens"] == list(pred.tokens)
            assert observed(resp) == (pred.draft_n, pred.draft_n_accepted), (prompt, pred.blocks)
            preds.append(pred)
        assert spec_metrics(srv.client, budget) == expected_metrics(preds)
    # p_min really cut blocks: fewer drafted tokens than the same requests without it
    full = [synth.predict(man, pr, n_max=budget, n_predict=n) for pr, n in PROMPTS[:3]]
    assert sum(p.draft_n for p in preds) < sum(p.draft_n for p in full)


def test_p_min_without_confidence_head_disables_speculation(engine, pairs, logs):
    # llama-server logs the refusal and serves without any draft; the predictor refuses outright
    man = synth.load_manifest(pairs[1.0].manifest)
    with pytest.raises(UsageError, match="confidence head"):
        synth.predict_from_last(man, 0, p_min=0.5)
    with serve(engine, pairs[1.0], logs, n_max=7, p_min=0.5) as srv:
        resp = complete(srv.client, [1, 2], 16)
        assert "draft_n" not in resp["timings"]
        assert resp["tokens"] == list(synth.predict(man, [1, 2], n_max=7, n_predict=16).tokens)
        assert "DSpark draft has no confidence head" in srv.log_tail(400)


# ------------------------------------------------------------------ vision + chat


@pytest.fixture(scope="module")
def vision_pair(tmp_path_factory) -> synth.SynthPair:
    return synth.write_pair(tmp_path_factory.mktemp("vision"), accept_rate=0.7, vision=True, seed=3)


def image_messages(image: Path, text: str) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def templated(client: ServerClient, messages: list[dict]) -> str:
    return client.apply_template(messages)


@pytest.mark.parametrize("budget", BUDGETS)
def test_chat_with_image_matches_prediction(engine, vision_pair, logs, budget):
    man = synth.load_manifest(vision_pair.manifest)
    with serve(engine, vision_pair, logs, n_max=budget, mmproj=vision_pair.mmproj) as srv:
        marker = srv.client.props()["media_marker"]
        for question, n_predict in (("What is in this image?", 30), ("Describe it in detail, please.", 21)):
            messages = image_messages(vision_pair.image, question)
            resp = srv.client.chat({"messages": messages, "temperature": 0, "max_tokens": n_predict})
            last = synth.last_prompt_token(man, templated(srv.client, messages), marker)
            pred = synth.predict_from_last(man, last, n_max=budget, n_predict=n_predict)
            assert resp["usage"]["prompt_tokens"] > 4  # the 4 image embeddings were part of the prompt
            assert resp["choices"][0]["message"]["content"] == pred.text
            assert observed(resp) == (pred.draft_n, pred.draft_n_accepted), (question, pred.blocks)


def test_streamed_chat_with_image_matches_prediction(engine, vision_pair, logs):
    man = synth.load_manifest(vision_pair.manifest)
    with serve(engine, vision_pair, logs, n_max=7, mmproj=vision_pair.mmproj) as srv:
        messages = image_messages(vision_pair.image, "And now?")
        chunks = list(srv.client.chat_stream({"messages": messages, "temperature": 0, "max_tokens": 26}))
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        last = synth.last_prompt_token(man, templated(srv.client, messages), srv.client.props()["media_marker"])
        pred = synth.predict_from_last(man, last, n_max=7, n_predict=26)
        assert text == pred.text
        final = [c for c in chunks if c.get("timings")][-1]
        assert observed(final) == (pred.draft_n, pred.draft_n_accepted)


def test_python_tokenizer_matches_the_server(engine, pairs, logs):
    man = synth.load_manifest(pairs[1.0].manifest)
    with serve(engine, pairs[1.0], logs, n_max=3) as srv:
        assert srv.client.tokenize("hello world") == [82, 50, 100]
        prompt = templated(srv.client, [{"role": "user", "content": "Write a haiku about GPUs"}])
        server_ids = srv.client.tokenize(prompt)
        assert server_ids == synth.test_tokenize(prompt, 128)
        assert synth.last_prompt_token(man, prompt) == server_ids[-1]
