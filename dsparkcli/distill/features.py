"""The target's tapped features, computed once for every sequence of a Dataset and kept on the training device
(``Features``: a few GB for ~2 M tokens, so a training step costs only the draft), and the batches drawn from
them: the chosen sequences' tokens and features, random anchors among the generated tokens, and the target's
top-k next tokens per position for the soft loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dsparkcli.distill.data import Dataset
from dsparkcli.distill.target import Target


@dataclass(frozen=True)
class Features:
    """Per-token tap features for every sequence of a Dataset, on the training device."""

    data: torch.Tensor  # [n_tokens, nt*E]
    tokens: torch.Tensor  # [n_tokens] int64
    top_ids: torch.Tensor  # [n_tokens, K] int64: the target's top-k next tokens at each position
    top_p: torch.Tensor  # [n_tokens, K] float16: their probabilities
    offsets: list[int]
    lens: list[int]
    prompt_lens: list[int]


def compute_features(
    target: Target,
    ds: Dataset,
    taps: Sequence[int],
    max_len: int,
    dtype: torch.dtype,
    progress: Callable[[str, int, int], None] | None = None,
    batch_tokens: int = 32768,
    soft_k: int = 8,
) -> Features:
    dev = target.device
    lens = [min(int(ds.offsets[i + 1] - ds.offsets[i]), max_len) for i in range(len(ds))]
    offs = [0]
    for n in lens:
        offs.append(offs[-1] + n)
    feat = torch.empty(offs[-1], len(taps) * target.cfg.n_embd, dtype=dtype, device=dev)
    toks = torch.empty(offs[-1], dtype=torch.long, device=dev)
    top_ids = torch.zeros(offs[-1], soft_k, dtype=torch.long, device=dev)
    top_p = torch.zeros(offs[-1], soft_k, dtype=torch.float16, device=dev)
    order = sorted(range(len(ds)), key=lambda i: lens[i])
    i = 0
    while i < len(order):
        tmax = lens[order[min(len(order) - 1, i)]]
        j = i
        while j < len(order) and (j - i + 1) * max(tmax, lens[order[j]]) <= batch_tokens:
            j += 1
        j = max(j, i + 1)
        idx = order[i:j]
        t = max(lens[k] for k in idx)
        x = torch.zeros(len(idx), t, dtype=torch.long, device=dev)
        for r, k in enumerate(idx):
            x[r, : lens[k]] = torch.from_numpy(ds.seq(k)[: lens[k]].astype(np.int64))
        h, f = target(x, taps, logits=False)
        for r, k in enumerate(idx):
            feat[offs[k] : offs[k + 1]] = f[r, : lens[k]].to(dtype)
            toks[offs[k] : offs[k + 1]] = x[r, : lens[k]]
            # the head one sequence at a time: [T, V] logits, not [B, T, V]
            prob = torch.softmax((h[r, : lens[k]] @ target.head.T).float(), -1)
            p, ids = prob.topk(soft_k, -1)
            top_ids[offs[k] : offs[k + 1]] = ids
            top_p[offs[k] : offs[k + 1]] = p.to(torch.float16)
        i = j
        if progress:
            progress("features", i, len(order))
    return Features(feat, toks, top_ids, top_p, offs, lens, [min(int(p), n) for p, n in zip(ds.prompt_lens, lens)])


def draw_batch(
    fs: Features, idx: Sequence[int], anchors: int, size: int, rng: np.random.Generator, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, T], features [B, T, F], anchors [B, A] for the chosen sequences."""
    tokens, feats, anc, _, _ = draw_batch_soft(fs, idx, anchors, size, rng, dev, soft=False)
    return tokens, feats, anc


def draw_batch_soft(
    fs: Features,
    idx: Sequence[int],
    anchors: int,
    size: int,
    rng: np.random.Generator,
    dev: torch.device,
    soft: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``draw_batch`` plus the target's top-k ids/probabilities per position [B, T, K] (when ``soft``)."""
    t = max(fs.lens[i] for i in idx)
    b = len(idx)
    tokens = torch.zeros(b, t, dtype=torch.long, device=dev)
    feats = torch.zeros(b, t, fs.data.shape[1], dtype=fs.data.dtype, device=dev)
    k = fs.top_ids.shape[1]
    top_ids = torch.zeros(b, t, k, dtype=torch.long, device=dev) if soft else None
    top_p = torch.zeros(b, t, k, dtype=torch.float16, device=dev) if soft else None
    anc = np.zeros((b, anchors), dtype=np.int64)
    for r, i in enumerate(idx):
        n = fs.lens[i]
        tokens[r, :n] = fs.tokens[fs.offsets[i] : fs.offsets[i + 1]]
        feats[r, :n] = fs.data[fs.offsets[i] : fs.offsets[i + 1]]
        if top_ids is not None and top_p is not None:
            top_ids[r, :n] = fs.top_ids[fs.offsets[i] : fs.offsets[i + 1]]
            top_p[r, :n] = fs.top_p[fs.offsets[i] : fs.offsets[i + 1]]
        lo, hi = fs.prompt_lens[i], n - 2  # an anchor is a generated token with at least one after it
        if hi < lo:
            lo = hi = max(0, n - 2)
        anc[r] = rng.integers(lo, hi + 1, size=anchors)
    return tokens, feats, torch.from_numpy(anc).to(dev), top_ids, top_p
