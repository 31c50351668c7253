"""A llama.cpp GGUF target (llama, qwen3) as a torch module: the teacher a DSpark draft is distilled from.

The weights are dequantised from the GGUF itself (``gguf.quants.dequantize``), so the teacher is exactly
the file llama.cpp serves, not an HF checkpoint it was converted from. Two conventions matter:

* RoPE. llama.cpp's converter permutes the rows of ``attn_q``/``attn_k`` of ``llama`` models so that its
  NORM rope (rotating adjacent pairs 2i, 2i+1) equals HF's rotate-half rope. We keep the GGUF rows as
  they are and rotate adjacent pairs, i.e. compute exactly what llama.cpp computes (undoing the permutation
  and rotating halves would be the same numbers). ``qwen3`` is stored unpermuted with NEOX rope (halves).
* Taps. ``dflash.target_layers`` ids index llama.cpp's ``t_layer_inp``: id ``il`` is the INPUT of layer
  ``il`` (id 0 = the token embeddings). ``forward`` returns those inputs for the requested ids.

Tied embeddings (no ``output.weight``) use ``token_embd`` as the head, as llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F

from dsparkcli.errors import UsageError

# Archs whose llama.cpp graph fills t_layer_inp (so DSpark can tap them) and whose block we implement here.
SUPPORTED_ARCHS = {"llama": "norm", "qwen3": "neox"}


@dataclass(frozen=True)
class TargetConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: int
    rope_base: float
    rope_mode: str  # "norm" (adjacent pairs) or "neox" (halves), llama.cpp's names
    eps: float
    context_length: int


@dataclass(frozen=True)
class TargetTokenizer:
    """The GGUF tokenizer fields a draft must carry verbatim (llama.cpp loads a vocab for the draft too)."""

    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int] | None
    merges: list[str] | None
    scores: list[float] | None
    special: dict[str, int]  # bos/eos/eot/unknown/padding ids as the target names them
    chat_template: str | None


def _field(reader, key: str, default=None):  # type: ignore[no-untyped-def]
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_config(reader) -> TargetConfig:  # type: ignore[no-untyped-def]
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UsageError(
            f"distill supports targets of arch {', '.join(sorted(SUPPORTED_ARCHS))}; this one is {arch!r}"
        )
    a = arch
    n_embd = int(_field(reader, f"{a}.embedding_length"))
    n_head = int(_field(reader, f"{a}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{a}.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, f"{a}.attention.key_length", n_embd // n_head))
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    return TargetConfig(
        arch=arch,
        n_layer=int(_field(reader, f"{a}.block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=int(_field(reader, f"{a}.feed_forward_length")),
        vocab=int(_field(reader, f"{a}.vocab_size", len(tokens))),
        rope_base=float(_field(reader, f"{a}.rope.freq_base", 10000.0)),
        rope_mode=SUPPORTED_ARCHS[arch],
        eps=float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(_field(reader, f"{a}.context_length", 2048)),
    )


def read_tokenizer(reader) -> TargetTokenizer:  # type: ignore[no-untyped-def]
    special = {}
    for name in ("bos", "eos", "eot", "eom", "unknown", "padding", "seperator"):
        v = _field(reader, f"tokenizer.ggml.{name}_token_id")
        if v is not None:
            special[name] = int(v)
    scores = _field(reader, "tokenizer.ggml.scores")
    return TargetTokenizer(
        model=str(_field(reader, "tokenizer.ggml.model")),
        pre=_field(reader, "tokenizer.ggml.pre"),
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=_field(reader, "tokenizer.ggml.token_type"),
        merges=_field(reader, "tokenizer.ggml.merges"),
        scores=list(scores) if scores is not None else None,
        special=special,
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, base: float, mode: str) -> torch.Tensor:
    """Rotate ``x`` [..., T, H, D] by positions ``pos`` [..., T] the way ggml_rope_ext does (NORM or NEOX)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)  # [D/2]
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, D/2]
    cos = ang.cos()[..., None, :].to(x.dtype)
    sin = ang.sin()[..., None, :].to(x.dtype)
    if mode == "norm":  # adjacent pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        r0, r1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
        return torch.stack((r0, r1), dim=-1).flatten(-2)
    x0, x1 = x[..., : d // 2], x[..., d // 2 :]  # neox: halves
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


class Target(torch.nn.Module):
    """Frozen teacher. ``forward`` returns logits and the requested layer inputs (llama.cpp tap ids)."""

    def __init__(self, cfg: TargetConfig, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        self.w = {k: v for k, v in weights.items()}
        self.tok_embd = weights["token_embd.weight"]  # [V, E]
        self.head = weights.get("output.weight", self.tok_embd)  # tied: llama.cpp duplicates token_embd

    def to(self, device=None, dtype=None):  # type: ignore[override,no-untyped-def]
        for k, v in list(self.w.items()):
            self.w[k] = v.to(device=device, dtype=dtype if v.dim() > 1 else torch.float32)
        self.tok_embd = self.w["token_embd.weight"]
        self.head = self.w.get("output.weight", self.tok_embd)
        return self

    @property
    def device(self) -> torch.device:
        return self.tok_embd.device

    def _layer(self, il: int, x: torch.Tensor, pos: torch.Tensor, attend: torch.Tensor | None,
               cache: tuple[torch.Tensor, torch.Tensor] | None = None, at: int | None = None) -> torch.Tensor:
        c, w, p = self.cfg, self.w, f"blk.{il}."
        b, t, _ = x.shape
        h = _rms(x, w[p + "attn_norm.weight"], c.eps)
        q = (h @ w[p + "attn_q.weight"].T).view(b, t, c.n_head, c.head_dim)
        k = (h @ w[p + "attn_k.weight"].T).view(b, t, c.n_head_kv, c.head_dim)
        v = (h @ w[p + "attn_v.weight"].T).view(b, t, c.n_head_kv, c.head_dim)
        if p + "attn_q_norm.weight" in w:  # qwen3
            q = _rms(q, w[p + "attn_q_norm.weight"], c.eps)
            k = _rms(k, w[p + "attn_k_norm.weight"], c.eps)
        q = rope(q, pos, c.rope_base, c.rope_mode)
        k = rope(k, pos, c.rope_base, c.rope_mode)
        if cache is not None:  # generation: write this step's K/V at column `at`, attend over the prefix
            ck, cv = cache
            ck[:, at : at + t] = k
            cv[:, at : at + t] = v
            k, v = ck[:, : at + t], cv[:, : at + t]
        rep = c.n_head // c.n_head_kv
        qh = q.transpose(1, 2)
        kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        if attend is None:
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attend)
        o = o.transpose(1, 2).reshape(b, t, c.n_head * c.head_dim)
        x = x + o @ w[p + "attn_output.weight"].T
        h = _rms(x, w[p + "ffn_norm.weight"], c.eps)
        f = F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        return x + f @ w[p + "ffn_down.weight"].T

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, taps: Sequence[int] = (), pos: torch.Tensor | None = None,
                logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, T] (right-padded is fine: causal) -> (logits [B, T, V] or, with ``logits=False``, the
        final normed hidden state [B, T, E]; taps [B, T, len(taps)*E])."""
        b, t = tokens.shape
        if pos is None:
            pos = torch.arange(t, device=tokens.device).expand(b, t)
        x = F.embedding(tokens, self.tok_embd)
        want = {il: None for il in taps}
        for il in range(self.cfg.n_layer):
            if il in want:
                want[il] = x
            x = self._layer(il, x, pos, None)
        feats = torch.cat([want[il] for il in taps], dim=-1) if taps else None
        h = _rms(x, self.w["output_norm.weight"], self.cfg.eps)
        return (h @ self.head.T if logits else h), feats

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new: int, stop: Sequence[int],
                 temperature: float = 0.0, generator: torch.Generator | None = None) -> list[list[int]]:
        """Batched decoding with a KV cache. Prompts are left-padded; returns only the new tokens.

        Greedy at temperature 0 (what `dspark bench` measures); sampled otherwise (prompt writing).
        """
        c, dev = self.cfg, self.device
        b = len(prompts)
        lp = max(len(p) for p in prompts)
        total = lp + max_new
        dtype = self.tok_embd.dtype
        toks = torch.zeros(b, lp, dtype=torch.long, device=dev)
        valid = torch.zeros(b, total, dtype=torch.bool, device=dev)
        for i, p in enumerate(prompts):
            toks[i, lp - len(p):] = torch.tensor(list(p), device=dev)
            valid[i, lp - len(p):] = True
        start = torch.tensor([lp - len(p) for p in prompts], device=dev)
        caches = [(torch.zeros(b, total, c.n_head_kv, c.head_dim, device=dev, dtype=dtype),
                   torch.zeros(b, total, c.n_head_kv, c.head_dim, device=dev, dtype=dtype))
                  for _ in range(c.n_layer)]
        out = torch.zeros(b, max_new, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        stop_t = torch.tensor(list(stop) or [-1], device=dev)
        cur, at = toks, 0
        cols = torch.arange(total, device=dev)
        for step in range(max_new):
            t = cur.shape[1]
            pos = (at + torch.arange(t, device=dev))[None, :] - start[:, None]
            rows = at + torch.arange(t, device=dev)
            # key column j visible to query row r iff j <= r and j is a real (non-pad) token
            attend = (cols[None, : at + t] <= rows[:, None])[None, None] & valid[:, None, None, : at + t]
            x = F.embedding(cur, self.tok_embd)
            for il in range(c.n_layer):
                x = self._layer(il, x, pos.clamp(min=0), attend, caches[il], at)
            h = _rms(x[:, -1], self.w["output_norm.weight"], c.eps)
            lg = (h @ self.head.T).float()
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(lg / temperature, -1), 1, generator=generator)[:, 0]
            else:
                nxt = lg.argmax(-1)
            nxt = torch.where(done, torch.zeros_like(nxt), nxt)
            out[:, step] = nxt
            done |= torch.isin(nxt, stop_t)
            at += t
            cur = nxt[:, None]
            valid[:, at] = True
            if bool(done.all()):
                out = out[:, : step + 1]
                break
        res = []
        for row in out.tolist():
            seq = []
            for tok in row:
                seq.append(tok)
                if tok in stop:
                    break
            res.append(seq)
        return res


def load_target(path: Path) -> tuple[Target, TargetTokenizer]:
    """Read and dequantise a GGUF target (CPU float32). Move it with ``target.to(device, dtype)``."""
    reader = gguf.GGUFReader(str(path))
    cfg = read_config(reader)
    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml ne -> numpy order
        weights[t.name] = torch.from_numpy(np.array(arr, dtype=np.float32).reshape(shape))
    if "rope_freqs.weight" in weights:
        raise UsageError("distill does not support llama3-style rope scaling (rope_freqs) yet")
    return Target(cfg, weights), read_tokenizer(reader)
