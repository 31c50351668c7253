"""llama.protocol and pairs on hand-made inputs: counters, the mean acceptance length, request bodies,
SSE lines, and the budget a pair is served with."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparkcli.errors import UsageError
from dsparkcli.llama import protocol
from dsparkcli.llama.protocol import SpecCounters
from dsparkcli.pairs import ResolvedFiles, ServerKnobs, server_config

METRICS_TEXT = f"""# HELP llamacpp:spec_decode_num_drafts_total verification steps
{protocol.M_DRAFTED} 12
{protocol.M_ACCEPTED} 7
{protocol.M_STEPS} 5
{protocol.M_PER_POS}0"}} 4
{protocol.M_PER_POS}2"}} 1
llamacpp:tokens_predicted_total 40
"""


def test_counters_from_metrics_text_fill_missing_positions():
    c = SpecCounters.from_metrics(METRICS_TEXT)
    assert (c.drafted, c.accepted, c.steps, c.accepted_per_pos) == (12, 7, 5, (4, 0, 1))
    assert c.acceptance_rate == 7 / 12
    assert c.mean_length == 1 + 7 / 5


def test_counters_add_up_and_round_trip():
    a = SpecCounters(10, 6, 4, (4, 2))
    b = SpecCounters(5, 5, 2, (2, 2, 1))
    assert a.plus(b) == SpecCounters(15, 11, 6, (6, 4, 1))
    assert SpecCounters.total([a, b, SpecCounters()]) == a.plus(b)
    assert a.plus(b).minus(a) == SpecCounters(5, 5, 2, (2, 2, 1))
    assert SpecCounters.from_record(a.to_record()) == a
    assert SpecCounters().mean_length is None and SpecCounters().acceptance_rate is None


def test_mean_acceptance_length_is_llama_cpps():
    assert protocol.mean_acceptance_length(30, 10) == 4.0  # 1 + accepted / verification steps
    assert protocol.mean_acceptance_length(0, 3) == 1.0
    assert protocol.mean_acceptance_length(5, 0) is None


def test_request_bodies():
    assert protocol.image_data_url("image/png", b"\x89PNG") == "data:image/png;base64,iVBORw=="
    msgs = protocol.build_messages("what?", ["data:x"], system="be brief")
    assert msgs[0] == {"role": "system", "content": "be brief"}
    assert msgs[1]["content"][-1] == {"type": "text", "text": "what?"}  # the text follows the last image
    with pytest.raises(UsageError, match="empty"):
        protocol.build_messages("  ")
    assert protocol.chat_payload(msgs, max_tokens=8, temp=0.0, seed=None) == {
        "messages": msgs,
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": True,
    }
    body = protocol.completion_payload(
        [1, 2], n_predict=4, seed=3, ignore_eos=False, response_fields=protocol.COMPLETION_FIELDS
    )
    assert body == {
        "prompt": [1, 2],
        "n_predict": 4,
        "temperature": 0,
        "seed": 3,
        "return_tokens": True,
        "ignore_eos": False,
        "cache_prompt": False,
        "response_fields": protocol.COMPLETION_FIELDS,
    }
    assert "seed" not in protocol.completion_payload("hi", n_predict=1)


def test_sse_lines_and_chunks():
    assert protocol.sse_data('data: {"a": 1}') == '{"a": 1}'
    assert protocol.sse_data("data: [DONE]") == protocol.SSE_DONE
    assert protocol.sse_data(": keep-alive") is None
    chunk = {
        "choices": [
            {"delta": {"content": "he"}, "finish_reason": None},
            {"delta": {"content": "llo"}, "finish_reason": "stop"},
        ]
    }
    assert protocol.chunk_text(chunk) == (["he", "llo"], "stop")
    assert protocol.timings_drafts({}) == (0, 0)  # llama-server leaves both out when nothing was drafted


@pytest.mark.parametrize("knob,registry,expected", [(7, 3, 7), (None, 3, 3), (None, None, protocol.DEFAULT_BUDGET)])
def test_budget_comes_from_the_user_then_the_registry_then_the_default(knob, registry, expected):
    files = ResolvedFiles(target=Path("t.gguf"), draft=Path("d.gguf"), mmproj=None, budget=registry)
    cfg = server_config(files, ServerKnobs(budget=knob, p_min=0.5, ngl=99))
    assert (cfg.n_max, cfg.p_min, cfg.ngld) == (expected, 0.5, 99)
    plain = server_config(
        ResolvedFiles(Path("t.gguf"), None, None, registry), ServerKnobs(budget=knob, p_min=0.5, ngl=99)
    )
    assert (plain.n_max, plain.p_min, plain.ngld, plain.ngl) == (None, None, None, 99)  # draft-only settings


def test_knobs_are_checked():
    with pytest.raises(UsageError, match="--budget must be >= 1"):
        ServerKnobs(budget=0).validate()
    with pytest.raises(UsageError, match=r"--p-min must be within \[0, 1\]"):
        ServerKnobs(p_min=1.5).validate()
