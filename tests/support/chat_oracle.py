"""Exact expectations for chat requests on synthetic pairs, computed independently of the answer.

The prompt llama-server builds is read back through /apply-template; synth.last_prompt_token takes
its last token (text after the last media marker, "test" tokenizer), and the synthetic target's
answer depends on the prompt only through that token.
"""

from __future__ import annotations

from typing import Any

from dsparkcli.llama.client import ServerClient
from dsparkcli.synth import known_answer as synth


def expected_chat(
    client: ServerClient,
    man: synth.Manifest,
    messages: list[dict[str, Any]],
    *,
    n_max: int,
    n_predict: int,
    p_min: float = 0.0,
) -> synth.Prediction:
    prompt = client.apply_template(messages)
    last = synth.last_prompt_token(man, prompt, client.props().get("media_marker"))
    return synth.predict_from_last(man, last, n_max=n_max, n_predict=n_predict, p_min=p_min)
