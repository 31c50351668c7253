"""Distil a DSpark draft from a GGUF target: data (data.py) -> features -> training -> GGUF (export.py).

Training follows the published DSpark recipe where it fits the pinned engine (see model.py for the
graph): random anchors in the target's responses, block = [anchor, MASK x (B-1)], slot i predicts the
token at anchor+i+1, the Markov head's previous token teacher-forced, cross-entropy against the
target's greedy tokens weighted exp(-i/gamma) (mixed with a soft cross-entropy against the target's
top-k distribution at the same position: the near-misses carry what the hard label hides), and a confidence head trained (BCE) to predict whether
slot i's argmax is right. The target's tapped features are computed once and kept (on the GPU: a few
GB for ~2 M tokens), so each step costs only the draft.

Held-out sequences (whole prompt templates held out, so the number measures transfer to phrasings the
draft never saw, as the kit's are) give the simulated acceptance after each evaluation: 1 + the leading matches of the
greedy Markov chain against the target's greedy tokens, per budget 1..B (a block's slot i sees only
slots <= i, so budget k's proposals are the first k of budget B's). The best evaluation is exported.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dsparkcli.distill import corpus
from dsparkcli.distill.data import Dataset
from dsparkcli.distill.features import Features, compute_features, draw_batch, draw_batch_soft
from dsparkcli.distill.model import DraftConfig, DSparkDraft
from dsparkcli.distill.target import Target, TargetTokenizer
from dsparkcli.errors import UsageError

# Texts llama.cpp treats as end of generation: a mask token must never be one of them.
EOG_TEXTS = {
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "</s>",
    "<EOT>",
    "<|file_sep|>",
    "<|return|>",
    "<|call|>",
    "<|eom_id|>",
}


@dataclass(frozen=True)
class TrainOptions:
    layers: int = 2
    block_size: int = 8
    taps: tuple[int, ...] | None = None  # llama.cpp layer-input ids; None: spread like SpecForge
    n_taps: int = 3
    markov_rank: int = 64
    n_ff: int | None = None  # None: the target's
    minutes: float | None = None
    steps: int | None = None
    seed: int = 0
    batch: int = 16  # sequences per step
    anchors: int = 48  # blocks per sequence per step
    lr: float = 1e-3
    gamma: float = 4.0
    conf_weight: float = 0.1
    max_len: int = 1024
    val_fraction: float = 0.03
    val_groups: int = 2  # prompt templates per category held out whole for validation (0: random split)
    val_subjects: float = 0.1  # share of each category's template subjects (code tasks, topics) held out too
    soft_weight: float = 0.5  # share of the soft (top-k distribution) cross-entropy in the token loss
    soft_k: int = 8
    eval_every_s: float = 60.0
    checkpoint_every_s: float = 60.0
    mask_token_id: int | None = None


@dataclass
class TrainResult:
    config: DraftConfig
    steps: int
    seconds: float
    train_tokens: int
    val_sequences: int
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss since the last entry)
    evals: list[dict[str, Any]] = field(default_factory=list)  # {step, seconds, tau: {cat: [tau_k ...]}}
    best: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 1),
            "train_tokens": self.train_tokens,
            "val_sequences": self.val_sequences,
            "final_loss": self.losses[-1][1] if self.losses else None,
            "best": self.best,
        }


def default_taps(n_layer: int, n: int) -> tuple[int, ...]:
    """SpecForge spreads HF layer ids from 1 to n-3; llama.cpp's ids are layer inputs, i.e. HF id + 1."""
    if n <= 1:
        return (n_layer // 2 + 1,)
    hf = np.linspace(1, max(1, n_layer - 3), n).round().astype(int)
    return tuple(sorted({int(x) + 1 for x in hf}))


def pick_mask_token(tok: TargetTokenizer) -> int:
    """A control token that is no special id and no end-of-generation marker (the highest such id)."""
    special = set(tok.special.values())
    types = tok.token_types or []
    for i in range(len(tok.tokens) - 1, -1, -1):
        if i in special or tok.tokens[i] in EOG_TEXTS:
            continue
        if types and types[i] == 3:  # CONTROL
            return i
    for i in range(len(tok.tokens) - 1, -1, -1):  # no control tokens (e.g. the "test" tokenizer)
        if i not in special and tok.tokens[i] not in EOG_TEXTS:
            return i
    raise UsageError("the target's vocabulary has no token usable as the draft's mask")


def draft_config(target: Target, tok: TargetTokenizer, opt: TrainOptions) -> DraftConfig:
    c = target.cfg
    taps = opt.taps or default_taps(c.n_layer, opt.n_taps)
    if any(t < 0 or t >= c.n_layer for t in taps):
        raise UsageError(f"taps must be layer inputs 0..{c.n_layer - 1} of this {c.n_layer}-layer target")
    if opt.block_size < 1 or opt.block_size > 16:
        raise UsageError("block size must be 1..16")
    mask = opt.mask_token_id if opt.mask_token_id is not None else pick_mask_token(tok)
    if tok.tokens[mask] in EOG_TEXTS or mask in set(tok.special.values()):
        raise UsageError(f"mask token {mask} ({tok.tokens[mask]!r}) is a special/end-of-generation token")
    return DraftConfig(
        n_embd=c.n_embd,
        n_layer=opt.layers,
        n_head=c.n_head,
        n_head_kv=c.n_head_kv,
        head_dim=c.head_dim,
        n_ff=opt.n_ff or c.n_ff,
        vocab=c.vocab,
        taps=tuple(taps),
        block_size=opt.block_size,
        markov_rank=opt.markov_rank,
        rope_base=c.rope_base,
        eps=c.eps,
        mask_token_id=mask,
        context_length=c.context_length,
    )


def _slot_targets(
    tokens: torch.Tensor, anchors: torch.Tensor, size: int, lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced previous tokens, labels and validity [B, A, S]."""
    s = torch.arange(size, device=tokens.device)
    pos = anchors[:, :, None] + s  # the slot's own position; it predicts pos+1
    t = tokens.shape[1]
    valid = (pos + 1) < lens[:, None, None]
    flat = lambda p: tokens.gather(1, p.clamp(max=t - 1).flatten(1)).view_as(p)  # noqa: E731
    return flat(pos), flat(pos + 1), valid


def loss_fn(
    draft: DSparkDraft,
    tokens: torch.Tensor,
    feats: torch.Tensor,
    anchors: torch.Tensor,
    lens: torch.Tensor,
    embed: torch.Tensor,
    head: torch.Tensor,
    gamma: float,
    conf_weight: float,
    soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    soft_weight: float = 0.0,
) -> torch.Tensor:
    """``soft``: the target's top-k (ids, probabilities) per position [B, T, K]; slot i at position p is
    scored against the distribution at p (the one that chose the token at p + 1)."""
    size = draft.cfg.block_size
    te, _ = draft.blocks(tokens, feats, anchors, size, embed)
    prev, labels, valid = _slot_targets(tokens, anchors, size, lens)
    bias, w1 = draft.markov_bias(prev)
    logits = (te @ head.T.to(te.dtype)).float() + bias.float()
    w = torch.exp(-torch.arange(size, device=te.device, dtype=torch.float32) / gamma) * valid
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(w)
    if soft is not None and soft_weight > 0:
        pos = (anchors[:, :, None] + torch.arange(size, device=te.device)).clamp(max=tokens.shape[1] - 1)
        b, a, _ = pos.shape
        k = soft[0].shape[-1]
        gather = pos.flatten(1)[:, :, None].expand(b, a * size, k)
        ids = soft[0].gather(1, gather).view(b, a, size, k)
        p = soft[1].gather(1, gather).view(b, a, size, k).float()
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-6)  # the top-k renormalised
        logq = torch.log_softmax(logits, -1).gather(-1, ids)
        ce = (1 - soft_weight) * ce + soft_weight * -(p * logq).sum(-1)
    right = (logits.argmax(-1) == labels).float()
    conf_logit = draft.conf(torch.cat((te, w1.to(te.dtype)), -1)).squeeze(-1).float()  # sigmoid in the loss
    bce = F.binary_cross_entropy_with_logits(conf_logit, right, reduction="none")
    denom = w.sum().clamp(min=1.0)
    return (ce * w).sum() / denom + conf_weight * (bce * w).sum() / denom


@torch.no_grad()
def evaluate(
    draft: DSparkDraft,
    fs: Features,
    idx: Sequence[int],
    categories: Sequence[str],
    embed: torch.Tensor,
    head: torch.Tensor,
    anchors: int = 64,
    seed: int = 1234,
) -> dict[str, list[float]]:
    """Simulated mean acceptance length per category at budgets 1..B (index k-1), on held-out sequences."""
    size = draft.cfg.block_size
    rng = np.random.default_rng(seed)
    dev = fs.data.device
    per_cat: dict[str, list[np.ndarray]] = {}
    draft.eval()
    for chunk in [idx[i : i + 8] for i in range(0, len(idx), 8)]:
        tokens, feats, anc = draw_batch(fs, chunk, anchors, size, rng, dev)
        lens = torch.tensor([fs.lens[i] for i in chunk], device=dev)
        props, _ = draft.propose(tokens, feats, anc, size, embed, head)
        _, labels, valid = _slot_targets(tokens, anc, size, lens)
        ok = ((props == labels) & valid).int().cumprod(-1)  # a slot counts only if all before it matched
        lead = ok.sum(-1).cpu().numpy()  # [B, A]
        full = valid.all(-1).cpu().numpy()  # only blocks wholly inside the response
        for r, i in enumerate(chunk):
            per_cat.setdefault(categories[i], []).append(lead[r][full[r]])
    draft.train()
    out = {}
    for cat, leads in sorted(per_cat.items()):
        lead = np.concatenate(leads)
        if lead.size:
            out[cat] = [round(float(1 + np.minimum(lead, k).mean()), 4) for k in range(1, size + 1)]
    return out


def split_validation(ds: Dataset, opt: TrainOptions, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(validation, training) sequence indices. With ``val_groups``, that many prompt templates per
    category are held out whole (none of their sequences is trained on), and with ``val_subjects`` that
    share of each category's subjects too (corpus.group_name: a code task is held out from every
    template); up to ``val_fraction`` of the data is drawn from held-out templates whose subject is held
    out as well (or that have none). A sequence with only one of the two held out is neither trained on
    nor validated: training on it would show the draft a held-out task or template. Categories with too
    few templates, and ungrouped data, fall back to a random split."""
    n = len(ds)
    n_val = max(1, int(round(n * opt.val_fraction))) if n > 4 else 1
    templates, subjects = zip(*(corpus.split_group(g) for g in ds.groups)) if n else ((), ())
    held: set[str] = set()
    held_subjects: dict[str, set[str]] = {}  # per category; a category absent here holds no subject out
    if opt.val_groups > 0:
        by_cat: dict[str, set[str]] = {}
        subjects_by_cat: dict[str, set[str]] = {}
        for c, g, s in zip(ds.categories, templates, subjects):
            if g:
                by_cat.setdefault(c, set()).add(g)
            if s:
                subjects_by_cat.setdefault(c, set()).add(s)
        for c, gs in sorted(by_cat.items()):
            if len(gs) >= 4 * opt.val_groups:
                pick = rng.permutation(sorted(gs))[: opt.val_groups]
                held.update(str(g) for g in pick)
                ss = sorted(subjects_by_cat.get(c, ()))
                n_subjects = int(round(len(ss) * opt.val_subjects))
                if n_subjects and len(ss) >= 4 * n_subjects:
                    held_subjects[c] = {str(x) for x in rng.permutation(ss)[:n_subjects]}

    def subject_held(i: int) -> bool:
        return subjects[i] in held_subjects.get(ds.categories[i], ())

    if held:
        pool = [
            i
            for i in range(n)
            if templates[i] in held and (not subjects[i] or ds.categories[i] not in held_subjects or subject_held(i))
        ]
        val = sorted(int(pool[i]) for i in rng.permutation(len(pool))[:n_val])
        train = [i for i in range(n) if templates[i] not in held and not subject_held(i)]
        if val and train:
            return val, [int(i) for i in rng.permutation(train)]
    perm = rng.permutation(n)
    return sorted(int(i) for i in perm[:n_val]), (
        [int(i) for i in perm[n_val:]] or sorted(int(i) for i in perm[:n_val])
    )


def _score(tau: dict[str, list[float]]) -> float:
    return float(np.mean([v[-1] for v in tau.values()])) if tau else 0.0


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(
    target: Target,
    tok: TargetTokenizer,
    ds: Dataset,
    opt: TrainOptions,
    work: Path,
    progress: Callable[[str, int, int, dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[DSparkDraft, TrainResult]:
    """Train (or resume from ``work/ckpt.pt``) and return the best draft by held-out simulated acceptance."""
    if opt.minutes is None and opt.steps is None:
        raise UsageError("give --minutes or --steps")
    dev = target.device
    gpu = dev.type == "cuda"
    dtype = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(opt.seed)
    rng = np.random.default_rng(opt.seed)
    cfg = draft_config(target, tok, opt)
    draft = DSparkDraft(cfg).to(dev)
    with torch.no_grad():  # start at the target's own output scale: logits of embed -> head are sane
        draft.norm.weight.copy_(target.w["output_norm.weight"].to(dev))
    embed = target.tok_embd
    head = target.head
    val_idx, train_idx = split_validation(ds, opt, rng)

    def feat_progress(stage: str, done: int, total: int) -> None:
        if progress:
            progress(stage, done, total, {})

    fs = compute_features(target, ds, cfg.taps, opt.max_len, dtype, feat_progress, soft_k=opt.soft_k)
    optim = torch.optim.AdamW(draft.parameters(), lr=opt.lr, betas=(0.9, 0.95), weight_decay=0.01)
    res = TrainResult(cfg, 0, 0.0, sum(fs.lens[i] - fs.prompt_lens[i] for i in train_idx), len(val_idx))
    best_state: dict[str, torch.Tensor] | None = None
    ckpt = work / "ckpt.pt"
    if ckpt.exists():
        st = torch.load(ckpt, map_location=dev, weights_only=False)
        if st.get("config") == cfg.to_dict():
            draft.load_state_dict(st["draft"])
            optim.load_state_dict(st["optim"])
            res.steps, res.seconds = st["steps"], st["seconds"]
            res.losses, res.evals, res.best = st["losses"], st["evals"], st["best"]
            best_state = st.get("best_state")
            rng = np.random.default_rng(opt.seed + res.steps)
    total_s = opt.minutes * 60 if opt.minutes is not None else None
    warm = 50

    def frac() -> float:
        f = []
        if total_s:
            f.append(res.seconds / total_s)
        if opt.steps:
            f.append(res.steps / opt.steps)
        return max(f)

    def checkpoint() -> None:
        _save_atomic(
            {
                "config": cfg.to_dict(),
                "draft": draft.state_dict(),
                "optim": optim.state_dict(),
                "steps": res.steps,
                "seconds": res.seconds,
                "losses": res.losses,
                "evals": res.evals,
                "best": res.best,
                "best_state": best_state,
            },
            ckpt,
        )

    def run_eval() -> None:
        nonlocal best_state
        with torch.autocast(device_type=dev.type, dtype=dtype, enabled=gpu):
            tau = evaluate(draft, fs, val_idx, ds.categories, embed, head)
        entry = {"step": res.steps, "seconds": round(res.seconds, 1), "tau": tau}
        res.evals.append(entry)
        if res.best is None or _score(tau) > _score(res.best["tau"]):
            res.best = entry
            best_state = {k: v.detach().clone() for k, v in draft.state_dict().items()}

    draft.train()
    last_eval = last_ckpt = res.seconds
    acc, acc_n = 0.0, 0
    t_start = time.monotonic() - res.seconds
    while frac() < 1.0:
        if should_stop and should_stop():
            break
        f = frac()
        lr = opt.lr * min(1.0, (res.steps + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, f)))
        for g in optim.param_groups:
            g["lr"] = max(lr, opt.lr * 0.02)
        idx = [train_idx[int(i)] for i in rng.integers(0, len(train_idx), size=opt.batch)]
        tokens, feats, anc, top_ids, top_p = draw_batch_soft(
            fs, idx, opt.anchors, cfg.block_size, rng, dev, soft=opt.soft_weight > 0
        )
        lens = torch.tensor([fs.lens[i] for i in idx], device=dev)
        with torch.autocast(device_type=dev.type, dtype=dtype, enabled=gpu):
            loss = loss_fn(
                draft,
                tokens,
                feats,
                anc,
                lens,
                embed,
                head,
                opt.gamma,
                opt.conf_weight,
                (top_ids, top_p) if top_ids is not None and top_p is not None else None,
                opt.soft_weight,
            )
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optim.step()
        res.steps += 1
        acc += float(loss.detach())
        acc_n += 1
        res.seconds = time.monotonic() - t_start
        if res.seconds - last_eval >= opt.eval_every_s:
            res.losses.append((res.steps, round(acc / acc_n, 4)))
            acc, acc_n = 0.0, 0
            run_eval()
            last_eval = res.seconds
        if res.seconds - last_ckpt >= opt.checkpoint_every_s:
            checkpoint()
            last_ckpt = res.seconds
        if progress:
            progress(
                "train",
                int(f * 1000),
                1000,
                {
                    "step": res.steps,
                    "loss": float(loss.detach()),
                    "best": _score(res.best["tau"]) if res.best else None,
                },
            )
    if acc_n:
        res.losses.append((res.steps, round(acc / acc_n, 4)))
    run_eval()
    checkpoint()
    if best_state is not None:
        draft.load_state_dict(best_state)
    return draft, res


def options_dict(opt: TrainOptions) -> dict[str, Any]:
    d = asdict(opt)
    d["taps"] = list(opt.taps) if opt.taps else None
    return d
