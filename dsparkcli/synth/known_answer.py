"""Synthetic known-answer target/draft pairs, and an exact predictor of what llama-server reports on them.

Construction (verified with llama.cpp 0c1e570, see docs in the shared reference, §6):

* Target, arch ``llama``: one-hot ``token_embd`` (n_embd >= vocab), every ``attn_output`` and ``ffn_down``
  zero (each layer adds exactly 0, so the last hidden state is the token's own embedding) and a
  permutation ``output`` with ``output[g(t), t] = 1``: the greedy next token is ``g(last token)``, with a
  margin of sqrt(n_embd), whatever came before (images included).
* Draft, arch ``dflash`` with a DSpark Markov head: ``output_norm = 0`` makes the backbone's logits exactly 0,
  ``markov_w1 = I`` and ``markov_w2[draft_map[r], r] = 1`` make slot i propose ``draft_map[prev_i]``, where
  prev_0 is the anchor (the last committed token) and prev_i the previous proposal. ``draft_map`` equals
  ``g`` except on the "wrong rows", so acceptance is a known, non-trivial quantity.
* Optional confidence head ``conf_proj`` = ``[0 (n_embd) ; c (vocab)]`` plus bias b: with t_embd = 0,
  slot i's confidence is ``sigmoid(c[prev_i] + b)``, so ``--spec-draft-p-min`` cuts a block right before
  the slot whose previous token has a low scripted confidence.
* Tokenizer model ``test`` in both files: ids are accepted as prompts, text is hashed in 5-byte chunks
  (``test_tokenize``) and every token detokenizes as its id in lowercase hex (``detokenize``). No token text
  looks like an end-of-generation marker, so generation never stops early.

The predictor replays llama-server's loop (tools/server/server-context.cpp, common/speculative.cpp):
the first token comes from prompt processing; then, while budget remains, a block anchored at the last
token is drafted with ``n_max`` clamped to ``block_size``, cut by ``p_min``, discarded when shorter
than ``n_min``, then truncated to ``n_predict - n_generated - 1``; the target accepts the longest
prefix that matches its greedy choice and always adds one token of its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparkcli.budget import rule as budget_mod
from dsparkcli.errors import UsageError, VerificationError
from dsparkcli.gguf.hashes import hash_file
from dsparkcli.outputs import check_output_dir, check_output_file
from dsparkcli.synth.known_answer_files import (
    HEAD_DIM,
    TARGET_LAYERS,
    write_draft,
    write_mmproj,
    write_png,
    write_target,
)

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
TARGET_NAME = "target-llama.gguf"
DRAFT_NAME = "draft-dspark.gguf"
MMPROJ_NAME = "mmproj-mlp.gguf"
IMAGE_NAME = "image.png"

# Confidence logits (c[t] + b, b = known_answer_files.CONF_BIAS) drawn from a coarse grid, far from typical
# p_min values, so float32 rounding on the engine side can never flip a comparison: sigmoid(-3, -1, 1, 3) =
# 0.047, 0.269, 0.731, 0.953.
CONF_LOGITS = (-3.0, -1.0, 1.0, 3.0)
CONF_WEIGHTS = (0.1, 0.15, 0.15, 0.6)


@dataclass(frozen=True)
class SynthPair:
    """Paths of one written pair. ``mmproj``/``image`` are None unless written with ``vision=True``."""

    target: Path
    draft: Path
    mmproj: Path | None
    image: Path | None
    manifest: Path


@dataclass(frozen=True)
class Manifest:
    """What a pair was built from: everything the predictor needs, plus provenance."""

    path: Path | None
    version: int
    vocab: int
    n_embd: int
    block_size: int
    seed: int
    accept_rate: float  # requested fraction of correct Markov rows
    g: tuple[int, ...]  # target: greedy next token after t is g[t]
    draft_map: tuple[int, ...]  # draft: proposal after t is draft_map[t]
    wrong_rows: tuple[int, ...]  # sorted t with draft_map[t] != g[t]
    mask_token_id: int
    confidence: bool
    conf_logits: tuple[float, ...] | None  # c[t] + b: slot confidence is sigmoid of this for prev token t
    vision: bool
    files: dict[str, dict[str, Any]]  # role -> {"name", "sha256", "bytes"}

    def confidence_of(self, token: int) -> float:
        if self.conf_logits is None:
            raise UsageError("this synthetic draft has no confidence head: use p_min 0")
        return 1.0 / (1.0 + math.exp(-self.conf_logits[token]))

    @property
    def correct_fraction(self) -> float:
        """Fraction of Markov rows that agree with the target (the realised accept rate per row)."""
        return 1.0 - len(self.wrong_rows) / self.vocab


@dataclass(frozen=True)
class Prediction:
    """Exactly what llama-server returns for one greedy request on a synthetic pair."""

    tokens: tuple[int, ...]  # generated token ids (`tokens` with return_tokens)
    text: str  # generated text (content), as llama-server detokenizes the "test" tokenizer
    draft_n: int  # timings.draft_n (0 means the server omits the field)
    draft_n_accepted: int  # timings.draft_n_accepted
    steps: int  # verification steps (/metrics spec_decode_num_drafts_total)
    accepted_per_pos: tuple[int, ...]  # /metrics spec_decode_num_accepted_tokens_per_pos_total{position=i}
    mean_len: float  # 1 + accepted / steps, as in the server's "draft acceptance" log line
    blocks: tuple[tuple[int, int], ...]  # per verification step: (drafted, accepted)
    n_max: int  # effective draft size after the block-size clamp
    budgets: tuple[int, ...] = ()  # --spec-draft-n-max auto: the draft length chosen at each step (0 = none)
    budget_margin: float = math.inf  # the closest any of those choices came to flipping (budget.rule.margin)


# ------------------------------------------------------------------ tokenizer "test"


def detokenize(tokens: Sequence[int]) -> str:
    """llama.cpp's "test" vocab turns every token into its id in lowercase hex (llama-vocab.cpp token_to_piece)."""
    return "".join(f"{int(t):x}" for t in tokens)


def test_tokenize(text: str, vocab: int) -> list[int]:
    """llama.cpp's "test" tokenizer: 5-byte chunks, hash = hash*31 + byte, id = hash % vocab.

    Applies to one text fragment; with an image in the prompt, each text chunk between media markers is
    tokenized on its own, so the last prompt token comes from the text after the last marker.
    """
    data = text.encode("utf-8")
    ids = []
    for start in range(0, len(data), 5):
        h = 0
        for byte in data[start : start + 5]:
            h = (h * 31 + byte) & 0xFFFFFFFFFFFFFFFF
        ids.append(h % vocab)
    return ids


test_tokenize.__test__ = False  # type: ignore[attr-defined]  # not a pytest test despite the name


# ------------------------------------------------------------------ building the maps


def _maps(vocab: int, accept_rate: float, seed: int) -> tuple[list[int], list[int], list[int]]:
    """g (one cycle through every token, so chains visit the whole vocab), draft_map, wrong rows."""
    import numpy as np  # deferred: only writers need numpy

    rng = np.random.default_rng(seed)
    order = rng.permutation(vocab)
    g = [0] * vocab
    for i in range(vocab):
        g[int(order[i])] = int(order[(i + 1) % vocab])
    n_wrong = int(round((1.0 - accept_rate) * vocab))
    wrong = sorted(int(r) for r in rng.choice(vocab, size=n_wrong, replace=False)) if n_wrong else []
    draft_map = list(g)
    for r in wrong:  # any other token: offset 1..vocab-1 from the right one
        draft_map[r] = (g[r] + 1 + int(rng.integers(vocab - 1))) % vocab
    return g, draft_map, wrong


def _conf_logits(vocab: int, seed: int) -> list[float]:
    import numpy as np  # deferred: only writers need numpy

    rng = np.random.default_rng([seed, 1])  # own stream: adding confidence does not change g or the wrong rows
    return [float(x) for x in rng.choice(CONF_LOGITS, size=vocab, p=CONF_WEIGHTS)]


def write_pair(
    outdir: str | Path,
    *,
    vocab: int = 128,
    accept_rate: float = 1.0,
    confidence: bool = False,
    vision: bool = False,
    seed: int = 0,
    block_size: int = 8,
    target_layers: int = TARGET_LAYERS,
) -> SynthPair:
    """Write target, draft (and mmproj + PNG with ``vision``) and manifest.json into ``outdir``.

    ``target_layers`` > 2 adds more zero layers: the same answers, a dearer target token (tune's tests
    need a target that costs more than the draft, as real targets do; the draft still taps layers 0, 1)."""
    if not 8 <= vocab <= 4096:
        raise UsageError(f"--vocab must be between 8 and 4096, got {vocab}")
    if not 0.0 <= accept_rate <= 1.0:
        raise UsageError(f"--accept-rate must be between 0 and 1, got {accept_rate}")
    if not 1 <= block_size <= 64:
        raise UsageError(f"--block-size must be between 1 and 64, got {block_size}")
    if not TARGET_LAYERS <= target_layers <= 256:
        raise UsageError(f"target_layers must be between {TARGET_LAYERS} and 256, got {target_layers}")
    out = check_output_dir(outdir)
    for name in (TARGET_NAME, DRAFT_NAME, MANIFEST_NAME, MANIFEST_NAME + ".tmp") + (
        (MMPROJ_NAME, IMAGE_NAME) if vision else ()
    ):
        if (out / name).exists() or (out / name).is_symlink():  # rewritten in place: a rerun, never a device or folder
            check_output_file(out / name, what="synth output")
    out.mkdir(parents=True, exist_ok=True)

    n_embd = HEAD_DIM * max(2, math.ceil(vocab / HEAD_DIM))  # one-hot embeddings need n_embd >= vocab
    g, draft_map, wrong = _maps(vocab, accept_rate, seed)
    conf = _conf_logits(vocab, seed) if confidence else None

    target, draft = out / TARGET_NAME, out / DRAFT_NAME
    write_target(target, vocab, n_embd, g, target_layers)
    write_draft(draft, vocab, n_embd, block_size, draft_map, conf)
    mmproj = image = None
    if vision:
        mmproj, image = out / MMPROJ_NAME, out / IMAGE_NAME
        write_mmproj(mmproj, n_embd, seed)
        write_png(image, seed)

    files = {
        role: {"name": p.name, "sha256": hash_file(p).file_sha256, "bytes": p.stat().st_size}
        for role, p in (("target", target), ("draft", draft), ("mmproj", mmproj), ("image", image))
        if p
    }
    doc = {
        "version": MANIFEST_VERSION,
        "kind": "dspark-synthetic-pair",
        "vocab": vocab,
        "n_embd": n_embd,
        "block_size": block_size,
        "seed": seed,
        "accept_rate": accept_rate,
        "mask_token_id": vocab - 1,
        "confidence": confidence,
        "vision": vision,
        "g": g,
        "draft_map": draft_map,
        "wrong_rows": wrong,
        "conf_logits": conf,
        "files": files,
    }
    manifest = out / MANIFEST_NAME
    tmp = manifest.with_suffix(".json.tmp")  # a reader never sees half a manifest
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(manifest)
    return SynthPair(target=target, draft=draft, mmproj=mmproj, image=image, manifest=manifest)


# ------------------------------------------------------------------ manifest


def load_manifest(path: str | Path) -> Manifest:
    """Read a manifest.json (or the directory holding one) written by ``write_pair``."""
    p = Path(path)
    if p.is_dir():
        p = p / MANIFEST_NAME
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"manifest not found: {p}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"not a synthetic-pair manifest (bad JSON): {p}: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "dspark-synthetic-pair":
        raise UsageError(f"not a synthetic-pair manifest: {p}")
    if doc.get("version") != MANIFEST_VERSION:
        raise UsageError(f"unsupported manifest version {doc.get('version')!r} in {p} (expected {MANIFEST_VERSION})")
    try:
        vocab = int(doc["vocab"])
        g = tuple(int(x) for x in doc["g"])
        draft_map = tuple(int(x) for x in doc["draft_map"])
        conf = doc.get("conf_logits")
        man = Manifest(
            path=p,
            version=int(doc["version"]),
            vocab=vocab,
            n_embd=int(doc["n_embd"]),
            block_size=int(doc["block_size"]),
            seed=int(doc["seed"]),
            accept_rate=float(doc["accept_rate"]),
            g=g,
            draft_map=draft_map,
            wrong_rows=tuple(int(x) for x in doc["wrong_rows"]),
            mask_token_id=int(doc["mask_token_id"]),
            confidence=bool(doc["confidence"]),
            conf_logits=tuple(float(x) for x in conf) if conf is not None else None,
            vision=bool(doc.get("vision", False)),
            files=dict(doc.get("files", {})),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"malformed synthetic-pair manifest {p}: {e.__class__.__name__}: {e}") from None
    if len(g) != vocab or len(draft_map) != vocab or sorted(g) != list(range(vocab)):
        raise UsageError(f"malformed synthetic-pair manifest {p}: g is not a permutation of the vocab")
    if man.conf_logits is not None and len(man.conf_logits) != vocab:
        raise UsageError(f"malformed synthetic-pair manifest {p}: conf_logits has the wrong length")
    return man


def verify_files(man: Manifest) -> None:
    """Raise VerificationError if a file next to the manifest is missing or differs from its recorded sha256."""
    if man.path is None:
        return
    for role, rec in man.files.items():
        f = man.path.parent / rec["name"]
        if not f.is_file():
            raise VerificationError(f"synthetic {role} missing: {f}")
        if hash_file(f).file_sha256 != rec["sha256"]:
            raise VerificationError(f"synthetic {role} was modified since it was written: {f}")


# ------------------------------------------------------------------ the predictor


def _draft_block(man: Manifest, anchor: int, n_max: int, n_min: int, p_min: float) -> list[int]:
    """common_speculative_impl_draft_dflash::draft for anchor-first DSpark: a block of ``n_max`` slots (the
    step's n_max, dspark's patch 0003), cut at the confidence threshold, dropped below ``n_min``."""
    block: list[int] = []
    prev = anchor
    for _ in range(n_max):
        if p_min > 0.0 and man.confidence_of(prev) < p_min:  # slot conf = sigmoid(c[prev] + b)
            break
        prev = man.draft_map[prev]
        block.append(prev)
    if len(block) < n_min:
        block = []
    return block


def predict_from_last(
    man: Manifest,
    last_token: int,
    *,
    n_max: int = 7,
    n_predict: int = 32,
    p_min: float = 0.0,
    n_min: int = 0,
    request_n_max: int | None = None,
    budget: budget_mod.CostTable | None = None,
) -> Prediction:
    """Predict llama-server's greedy output and counters given the prompt's last token.

    ``n_max`` is the server's ``--spec-draft-n-max`` (the block drafted; with ``budget``, the table's
    max k, as ``auto`` sets it); ``request_n_max`` a request's ``speculative.n_max`` (dspark's patches: each
    block has the step's n_max, the least of the server's, the request's, the adaptive choice and the tokens
    left to generate, and ``n_min`` applies to that block); ``budget``: the step lengths are chosen adaptively
    (``budget.rule``, the same request's estimate from its first step).

    The target's next token depends only on the current token and the draft's proposals only on the
    anchor, so the whole prompt (chat template, images) matters only through its last token.
    Assumes the slot's context is never filled (prompt + n_predict + n_max + 2 <= context per slot).
    """
    if not 0 <= last_token < man.vocab:
        raise UsageError(f"token {last_token} is outside the synthetic vocab (0..{man.vocab - 1})")
    if n_max < 1:
        raise UsageError(f"n_max must be at least 1, got {n_max}")
    if n_predict < 1:
        raise UsageError(f"n_predict must be at least 1, got {n_predict}")
    if n_min < 0:
        raise UsageError(f"n_min must be >= 0, got {n_min}")
    if p_min > 0.0 and not man.confidence:
        # llama-server refuses to start in this case ("DSpark draft has no confidence head")
        raise UsageError("p_min > 0 needs a draft with a confidence head (write the pair with confidence=True)")
    n_max_eff = min(n_max, man.block_size)  # speculative.cpp clamps anchor-first DSpark to block_size
    n_min_eff = min(n_min, man.block_size)

    tokens = [man.g[last_token]]  # sampled from the prompt's last logits
    per_pos = [0] * n_max_eff
    blocks: list[tuple[int, int]] = []
    chosen: list[int] = []
    est, margin = budget_mod.Estimate(), math.inf
    while len(tokens) < n_predict:
        anchor = tokens[-1]
        n_draft_max = n_predict - len(tokens) - 1  # server_slot::get_n_draft_max: n_remaining - 1
        if request_n_max is not None:
            n_draft_max = min(n_draft_max, request_n_max)  # ... and the request's own limit
        if budget is not None and n_draft_max > 0:  # the adaptive step length, within the impl's clamp
            margin = min(margin, budget_mod.margin(est, budget, min(n_draft_max, n_max_eff)))
            n_draft_max, est = budget_mod.choose(est, budget, min(n_draft_max, n_max_eff))
            chosen.append(n_draft_max)
        n_block = min(n_max_eff, n_draft_max)  # patch 0003: the block follows the step's n_max
        draft = _draft_block(man, anchor, n_block, n_min_eff, p_min) if n_block > 0 else []
        if not draft:
            tokens.append(man.g[anchor])  # plain single-token decode, not a verification step
            continue
        accepted = 0
        cur = anchor
        for proposal in draft:  # sample-and-match: accept while the target's greedy token equals the draft
            if man.g[cur] != proposal:
                break
            accepted += 1
            cur = proposal
        emitted = draft[:accepted] + [man.g[cur]]  # plus the target's own token at the first mismatch/end
        tokens.extend(emitted)
        blocks.append((len(draft), accepted))
        if budget is not None:
            est = budget_mod.accept(est, len(draft), accepted)
        for i in range(accepted):
            per_pos[i] += 1
    draft_n = sum(d for d, _ in blocks)
    draft_acc = sum(a for _, a in blocks)
    steps = len(blocks)
    return Prediction(
        tokens=tuple(tokens),
        text=detokenize(tokens),
        draft_n=draft_n,
        draft_n_accepted=draft_acc,
        steps=steps,
        accepted_per_pos=tuple(per_pos),
        mean_len=1.0 + draft_acc / steps if steps else 1.0,
        blocks=tuple(blocks),
        n_max=n_max_eff,
        budgets=tuple(chosen),
        budget_margin=margin,
    )


def predict(
    man: Manifest,
    prompt_tokens: Sequence[int],
    *,
    n_max: int = 7,
    n_predict: int = 32,
    p_min: float = 0.0,
    n_min: int = 0,
    request_n_max: int | None = None,
    budget: budget_mod.CostTable | None = None,
) -> Prediction:
    """Predict llama-server's response to a /completion request with these prompt token ids (temperature 0)."""
    if len(prompt_tokens) == 0:
        raise UsageError("the prompt needs at least one token")
    for t in prompt_tokens:
        if not 0 <= int(t) < man.vocab:
            raise UsageError(f"prompt token {t} is outside the synthetic vocab (0..{man.vocab - 1})")
    return predict_from_last(
        man,
        int(prompt_tokens[-1]),
        n_max=n_max,
        n_predict=n_predict,
        p_min=p_min,
        n_min=n_min,
        request_n_max=request_n_max,
        budget=budget,
    )


def last_prompt_token(man: Manifest, prompt_text: str, media_marker: str | None = None) -> int:
    """The last token llama-server gets for a templated text prompt (e.g. from POST /apply-template).

    With images, mtmd tokenizes each text chunk between media markers on its own, so only the text after
    the last marker counts (``media_marker`` comes from GET /props). Feed the result to predict_from_last.
    """
    tail = prompt_text.rsplit(media_marker, 1)[-1] if media_marker else prompt_text
    ids = test_tokenize(tail, man.vocab)
    if not ids:
        raise UsageError("the prompt ends with an image or is empty: llama-server needs text after the last image")
    return ids[-1]
