"""synth.py without the engine: hand-computed predictions, the GGUF contents, the manifest.

The predictions below were worked out by hand from llama-server's loop (first token from the prompt,
then per step: draft anchored at the last token, cut by p_min, dropped below n_min, truncated to
n_predict - generated - 1; accept while the target agrees; one target token per step).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dsparkcli.errors import UsageError
from dsparkcli.synth import known_answer as synth
from dsparkcli.synth.known_answer_files import MMPROJ_HIDDEN

V = 16
SUCC = tuple((t + 1) % V for t in range(V))  # g(t) = t + 1: the chain after token 0 is 1, 2, 3, ...


def hand_manifest(
    *, wrong: dict[int, int] | None = None, conf: dict[int, float] | None = None, block_size: int = 8
) -> synth.Manifest:
    draft_map = list(SUCC)
    for row, proposal in (wrong or {}).items():
        draft_map[row] = proposal
    conf_logits = None
    if conf is not None:
        conf_logits = tuple(conf.get(t, 3.0) for t in range(V))
    return synth.Manifest(
        path=None,
        version=1,
        vocab=V,
        n_embd=128,
        block_size=block_size,
        seed=0,
        accept_rate=1.0,
        g=SUCC,
        draft_map=tuple(draft_map),
        wrong_rows=tuple(sorted(wrong or {})),
        mask_token_id=V - 1,
        confidence=conf is not None,
        conf_logits=conf_logits,
        vision=False,
        files={},
    )


# ------------------------------------------------------------------ hand-computed predictions


def test_all_right_rows_accept_every_drafted_token():
    # first token 1; step 1: draft 2,3,4,5 (n_max 4) all accepted + 6; step 2: 7..10 + 11;
    # then only 1 token of budget is left (12 - 11 - 1 = 0 draft tokens): plain decode of 12.
    pred = synth.predict(hand_manifest(), [7, 0], n_max=4, n_predict=12)
    assert pred.tokens == tuple(range(1, 13))
    assert pred.blocks == ((4, 4), (4, 4))
    assert (pred.draft_n, pred.draft_n_accepted, pred.steps) == (8, 8, 2)
    assert pred.accepted_per_pos == (2, 2, 2, 2)
    assert pred.mean_len == 5.0


def test_wrong_row_inside_a_block_stops_acceptance_there():
    # row 5 proposes 9 instead of 6. Step 1 (anchor 1): draft 2,3,4,5,9; target agrees up to 5, then says 6.
    # Step 2 (anchor 6, budget 12-6-1 = 5): draft 7,8,9,10,11 all accepted, + 12.
    man = hand_manifest(wrong={5: 9})
    pred = synth.predict(man, [0], n_max=5, n_predict=12)
    assert pred.tokens == tuple(range(1, 13))  # the output is always the target's chain
    assert pred.text == "123456789abc"  # "test" tokenizer: lowercase hex per token
    assert pred.blocks == ((5, 4), (5, 5))
    assert (pred.draft_n, pred.draft_n_accepted, pred.steps) == (10, 9, 2)
    assert pred.accepted_per_pos == (2, 2, 2, 2, 1)
    assert pred.mean_len == 5.5


def test_last_block_is_truncated_to_the_remaining_budget():
    # as above, but n_predict 10: step 2 may draft only 10 - 6 - 1 = 3 tokens (7, 8, 9) + target's 10
    pred = synth.predict(hand_manifest(wrong={5: 9}), [0], n_max=5, n_predict=10)
    assert pred.tokens == tuple(range(1, 11))
    assert pred.blocks == ((5, 4), (3, 3))
    assert (pred.draft_n, pred.draft_n_accepted) == (8, 7)


def test_wrong_row_at_the_anchor_accepts_nothing_and_the_draft_chain_follows_its_own_proposals():
    # prompt ends in 4 -> first token 5; anchor 5 drafts 9 (wrong), then 10, 11 from the draft's own chain;
    # the target rejects 9 at once and emits 6. Next anchor 6 drafts 7, 8, 9: all right, + 10.
    pred = synth.predict(hand_manifest(wrong={5: 9}), [4], n_max=3, n_predict=9)
    assert pred.tokens == (5, 6, 7, 8, 9, 10, 11, 12, 13)
    # step 1: anchor 5, draft 9,10,11 -> 0 accepted, emits 6          (n = 2)
    # step 2: anchor 6, draft 7,8,9  -> 3 accepted, emits 7,8,9,10    (n = 6)
    # step 3: anchor 10, budget 9-6-1 = 2: draft 11,12 -> 2 accepted, emits 11,12,13 (n = 9)
    assert pred.blocks == ((3, 0), (3, 3), (2, 2))
    assert pred.accepted_per_pos == (2, 2, 1)


def test_confidence_cuts_the_block_before_the_slot_whose_previous_token_is_unsure():
    # conf(3) = sigmoid(-3) = 0.047 < p_min 0.5: a slot whose previous token is 3 is not drafted.
    # step 1 (anchor 1): slots prev=1 -> 2, prev=2 -> 3, prev=3 stop: draft 2,3 + target 4      (n = 4)
    # step 2 (anchor 4): draft 5,6,7,8,9, truncated to 8 - 4 - 1 = 3: 5,6,7 + target 8          (n = 8)
    man = hand_manifest(conf={3: -3.0})
    pred = synth.predict(man, [0], n_max=5, n_predict=8, p_min=0.5)
    assert pred.tokens == tuple(range(1, 9))
    assert pred.blocks == ((2, 2), (3, 3))
    # without p_min the head is not consulted: 5 drafted in step 1
    assert synth.predict(man, [0], n_max=5, n_predict=8).blocks == ((5, 5),)


def test_n_min_drops_short_drafts_of_the_steps_block():
    # n_min 3: the drafts from anchors 1 (2,3), 2 (3) and 3 (nothing) are too short -> plain decodes of 2, 3, 4;
    # anchor 4: 8 - 4 - 1 = 3 tokens are left to draft, so its block has 3 slots: 3 >= n_min, kept.
    man = hand_manifest(conf={3: -3.0})
    pred = synth.predict(man, [0], n_max=5, n_predict=8, p_min=0.5, n_min=3)
    assert pred.tokens == tuple(range(1, 9))
    assert pred.blocks == ((3, 3),)
    assert (pred.draft_n, pred.steps) == (3, 1)


def test_n_max_is_clamped_to_the_block_size():
    pred = synth.predict(hand_manifest(block_size=4), [0], n_max=7, n_predict=11)
    assert pred.n_max == 4
    assert pred.blocks == ((4, 4), (4, 4))  # 1 + 5 + 5 tokens = 11
    assert len(pred.accepted_per_pos) == 4


@pytest.mark.parametrize(("n_predict", "tokens"), [(1, (1,)), (2, (1, 2))])
def test_tiny_budgets_never_draft(n_predict, tokens):
    pred = synth.predict(hand_manifest(), [0], n_max=8, n_predict=n_predict)
    assert pred.tokens == tokens
    assert (pred.draft_n, pred.steps, pred.mean_len) == (0, 0, 1.0)


def test_only_the_last_prompt_token_matters():
    man = hand_manifest(wrong={5: 9})
    assert synth.predict(man, [3, 9, 12, 2], n_max=5, n_predict=20) == synth.predict_from_last(
        man, 2, n_max=5, n_predict=20
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_max": 0}, "n_max"),
        ({"n_predict": 0}, "n_predict"),
        ({"p_min": 0.5}, "confidence head"),
        ({"n_min": -1}, "n_min"),
    ],
)
def test_predictor_rejects_impossible_settings(kwargs, message):
    with pytest.raises(UsageError, match=message):
        synth.predict_from_last(hand_manifest(), 0, **kwargs)


def test_predictor_rejects_tokens_outside_the_vocab():
    with pytest.raises(UsageError, match="outside"):
        synth.predict(hand_manifest(), [3, 16])
    with pytest.raises(UsageError, match="at least one"):
        synth.predict(hand_manifest(), [])


# ------------------------------------------------------------------ tokenizer


def test_test_tokenizer_hash_and_hex_detokenizer():
    # "hello" = ((((104*31+101)*31+108)*31+108)*31+111) = 99162322; mod 128 = 82, mod 16 = 2
    assert synth.test_tokenize("hello", 128) == [82]
    assert synth.test_tokenize("hello", 16) == [2]
    assert synth.test_tokenize("hello world", 128) == [82, 50, 100]  # "hello", " worl", "d"
    assert synth.detokenize([10, 255, 0, 3]) == "aff03"


def test_last_prompt_token_uses_the_text_after_the_last_media_marker():
    man = hand_manifest()
    assert synth.last_prompt_token(man, "hello world") == 100 % V
    # after the marker the chunking restarts: "hello" is one full chunk again
    assert synth.last_prompt_token(man, "ab<m>cdefg<m>hello", "<m>") == 2
    with pytest.raises(UsageError, match="ends with an image"):
        synth.last_prompt_token(man, "describe <m>", "<m>")


# ------------------------------------------------------------------ writing a pair


def read_gguf(path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: np.array(t.data).reshape([int(x) for x in reversed(t.shape)]) for t in reader.tensors}
    fields = {}
    for name, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.STRING and len(field.types) == 1:
            fields[name] = bytes(field.parts[field.data[0]]).decode()
        elif field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            fields[name] = field.parts[field.data[0]][0].item()
        else:
            fields[name] = [field.parts[i] for i in field.data]
    return fields, tensors


@pytest.mark.parametrize("accept_rate", [1.0, 0.7, 0.3])
def test_write_pair_encodes_g_and_the_wrong_rows(tmp_path, accept_rate):
    pair = synth.write_pair(tmp_path, accept_rate=accept_rate, seed=4)
    man = synth.load_manifest(pair.manifest)
    assert len(man.wrong_rows) == round((1 - accept_rate) * 128)
    assert [r for r in range(128) if man.draft_map[r] != man.g[r]] == list(man.wrong_rows)
    # g is one cycle through the whole vocab, so long outputs visit every Markov row
    seen, t = set(), 0
    for _ in range(128):
        seen.add(t)
        t = man.g[t]
    assert len(seen) == 128 and t == 0

    tfields, target = read_gguf(pair.target)
    assert tfields["general.architecture"] == "llama"
    assert tfields["tokenizer.ggml.model"] == "test"
    out = target["output.weight"]  # numpy (vocab, n_embd): row g(t) picks up embedding dim t
    assert out.shape == (128, 128)
    assert [int(np.argmax(out[:, t])) for t in range(128)] == list(man.g)
    assert not target["blk.0.attn_output.weight"].any() and not target["blk.1.ffn_down.weight"].any()
    assert (target["token_embd.weight"] == np.eye(128)).all()

    dfields, draft = read_gguf(pair.draft)
    assert dfields["general.architecture"] == "dflash"
    assert dfields["dflash.block_size"] == 8
    assert dfields["tokenizer.ggml.mask_token_id"] == 127
    assert dfields["dflash.has_confidence_head"] is False
    w2 = draft["markov_w2.weight"]
    assert [int(np.argmax(w2[:, r])) for r in range(128)] == list(man.draft_map)
    assert not draft["output_norm.weight"].any()
    assert "conf_proj.weight" not in draft


def test_confidence_head_scripts_sigmoid_of_the_manifest_logits(tmp_path):
    pair = synth.write_pair(tmp_path, confidence=True, seed=2, vocab=64)
    man = synth.load_manifest(pair.manifest)
    _, draft = read_gguf(pair.draft)
    proj, bias = draft["conf_proj.weight"], draft["conf_proj.bias"]
    assert proj.shape == (1, man.n_embd + 64)
    assert not proj[0, : man.n_embd].any()  # t_embd part: zero
    logits = proj[0, man.n_embd :] + bias[0]
    assert np.allclose(logits, man.conf_logits)
    assert set(man.conf_logits) <= set(synth.CONF_LOGITS) and len(set(man.conf_logits)) > 1
    assert man.confidence_of(0) == pytest.approx(1 / (1 + math.exp(-man.conf_logits[0])))


def test_vision_pair_has_an_mlp_projector_of_the_target_width_and_a_png(tmp_path):
    from PIL import Image

    pair = synth.write_pair(tmp_path, vision=True, vocab=200)
    man = synth.load_manifest(pair.manifest)
    assert man.n_embd == 256  # one-hot embeddings need n_embd >= vocab, in multiples of the head size
    fields, mm = read_gguf(pair.mmproj)
    assert fields["clip.projector_type"] == "mlp"
    assert mm["mm.2.weight"].shape == (256, MMPROJ_HIDDEN)
    with Image.open(pair.image) as img:
        assert img.format == "PNG" and img.size == (48, 40)


def test_same_seed_same_files_other_seed_other_g(tmp_path):
    a = synth.load_manifest(synth.write_pair(tmp_path / "a", accept_rate=0.5, seed=9).manifest)
    b = synth.load_manifest(synth.write_pair(tmp_path / "b", accept_rate=0.5, seed=9).manifest)
    c = synth.load_manifest(synth.write_pair(tmp_path / "c", accept_rate=0.5, seed=10).manifest)
    assert a.files == b.files and a.g == b.g
    assert c.g != a.g and c.files["target"]["sha256"] != a.files["target"]["sha256"]
    synth.verify_files(a)


def test_manifest_records_file_hashes_and_detects_changes(tmp_path):
    from dsparkcli.errors import VerificationError

    pair = synth.write_pair(tmp_path)
    man = synth.load_manifest(tmp_path)  # a directory works too
    assert man.files["draft"]["bytes"] == pair.draft.stat().st_size
    with open(pair.draft, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(VerificationError, match="modified"):
        synth.verify_files(man)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"accept_rate": 1.5}, "accept-rate"),
        ({"vocab": 4}, "vocab"),
        ({"block_size": 0}, "block-size"),
    ],
)
def test_write_pair_rejects_bad_settings(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        synth.write_pair(tmp_path, **kwargs)


def test_load_manifest_errors_are_one_line_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        synth.load_manifest(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="bad JSON"):
        synth.load_manifest(bad)
    bad.write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(UsageError, match="not a synthetic-pair"):
        synth.load_manifest(bad)
    pair = synth.write_pair(tmp_path / "p")
    doc = json.loads(pair.manifest.read_text())
    doc["g"][0] = doc["g"][1]
    bad.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="permutation"):
        synth.load_manifest(bad)
