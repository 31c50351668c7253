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

from collections.abc import Callable, Iterator, Sequence
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


def check_arch(arch: object) -> str:
    """The target's arch, if distill can train a draft for it (else one line naming the ones it can)."""
    if arch not in SUPPORTED_ARCHS:
        raise UsageError(
            f"distill supports targets of arch {', '.join(sorted(SUPPORTED_ARCHS))}; this one is {arch!r}"
        )
    return str(arch)


def read_config(reader) -> TargetConfig:  # type: ignore[no-untyped-def]
    arch = check_arch(_field(reader, "general.architecture"))
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

    def _qkv(self, il: int, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``il``'s attention inputs for ``x`` [B, T, E]: q [B, T, H, D], k and v [B, T, Hkv, D], roped."""
        c, w, p = self.cfg, self.w, f"blk.{il}."
        b, t, _ = x.shape
        h = _rms(x, w[p + "attn_norm.weight"], c.eps)
        q = (h @ w[p + "attn_q.weight"].T).view(b, t, c.n_head, c.head_dim)
        k = (h @ w[p + "attn_k.weight"].T).view(b, t, c.n_head_kv, c.head_dim)
        v = (h @ w[p + "attn_v.weight"].T).view(b, t, c.n_head_kv, c.head_dim)
        if p + "attn_q_norm.weight" in w:  # qwen3
            q = _rms(q, w[p + "attn_q_norm.weight"], c.eps)
            k = _rms(k, w[p + "attn_k_norm.weight"], c.eps)
        return rope(q, pos, c.rope_base, c.rope_mode), rope(k, pos, c.rope_base, c.rope_mode), v

    def _post(self, il: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of layer ``il`` after attention: output projection, residual, FFN."""
        c, w, p = self.cfg, self.w, f"blk.{il}."
        x = x + o @ w[p + "attn_output.weight"].T
        h = _rms(x, w[p + "ffn_norm.weight"], c.eps)
        f = F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        return x + f @ w[p + "ffn_down.weight"].T

    def _layer(
        self,
        il: int,
        x: torch.Tensor,
        pos: torch.Tensor,
        attend: torch.Tensor | None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
        at: int | None = None,
    ) -> torch.Tensor:
        c = self.cfg
        b, t, _ = x.shape
        q, k, v = self._qkv(il, x, pos)
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
        return self._post(il, x, o)

    @torch.no_grad()
    def forward(
        self, tokens: torch.Tensor, taps: Sequence[int] = (), pos: torch.Tensor | None = None, logits: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
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
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new: int,
        stop: Sequence[int],
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> list[list[int]]:
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
            toks[i, lp - len(p) :] = torch.tensor(list(p), device=dev)
            valid[i, lp - len(p) :] = True
        start = torch.tensor([lp - len(p) for p in prompts], device=dev)
        caches = [
            (
                torch.zeros(b, total, c.n_head_kv, c.head_dim, device=dev, dtype=dtype),
                torch.zeros(b, total, c.n_head_kv, c.head_dim, device=dev, dtype=dtype),
            )
            for _ in range(c.n_layer)
        ]
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

    @torch.no_grad()
    def _prefill(
        self,
        slots: list[int],
        prompts: list[Sequence[int]],
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        chunk: int = 256,
    ) -> torch.Tensor:
        """Write the K/V of ``prompts`` into columns 0.. of cache rows ``slots``; return each prompt's last
        logits [n, V] (float32). Right-padded and causal, so padding never reaches a real position; the
        padding's K/V land past each prompt's length, where the decode mask never looks and the next
        decode step overwrites them."""
        c, dev = self.cfg, self.device
        out = []
        for lo in range(0, len(slots), chunk):  # chunks bound the prefill's activations for a big pool
            sl, ps = slots[lo : lo + chunk], prompts[lo : lo + chunk]
            n, lp = len(ps), max(len(p) for p in ps)
            toks = torch.zeros(n, lp, dtype=torch.long)
            for i, p in enumerate(ps):
                toks[i, : len(p)] = torch.tensor(list(p), dtype=torch.long)
            toks = toks.to(dev)
            rows = torch.tensor(sl, device=dev)
            pos = torch.arange(lp, device=dev).expand(n, lp)
            x = F.embedding(toks, self.tok_embd)
            rep = c.n_head // c.n_head_kv
            for il in range(c.n_layer):
                q, k, v = self._qkv(il, x, pos)
                ck, cv = caches[il]
                ck[rows, :, :lp] = k.transpose(1, 2)
                cv[rows, :, :lp] = v.transpose(1, 2)
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2),
                    k.transpose(1, 2).repeat_interleave(rep, dim=1),
                    v.transpose(1, 2).repeat_interleave(rep, dim=1),
                    is_causal=True,
                )
                x = self._post(il, x, o.transpose(1, 2).reshape(n, lp, c.n_head * c.head_dim))
            last = torch.tensor([len(p) - 1 for p in ps], device=dev)
            h = _rms(x[torch.arange(n, device=dev), last], self.w["output_norm.weight"], c.eps)
            out.append((h @ self.head.T).float())
        return torch.cat(out)

    @torch.no_grad()
    def generate_stream(
        self,
        prompts: Sequence[Sequence[int]],
        max_new: int,
        stop: Sequence[int],
        slots: int = 256,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        check_every: int = 8,
        stop_starting: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[int, list[int]]]:
        """Continuous batching: yields ``(index, new tokens)`` as each prompt finishes, the same tokens
        ``generate`` returns for it (greedy at temperature 0).

        A pool of ``slots`` sequences decodes together; when one ends (a stop token, or ``max_new``) its
        cache rows are refilled with the next prompt, so the device always decodes a full pool instead
        of waiting for a batch's longest answer. Each slot's sequence starts at cache column 0 (no left
        padding) and a step attends only up to the longest live sequence. Host syncs happen only at
        checks: every ``check_every`` steps (a stopped slot idles at most that long) and exactly when
        some slot reaches ``max_new`` (its length is known on the host without asking the device).
        Memory: a K/V cache of slots x (longest prompt + max_new) per layer. Stop early by closing the
        iterator (``break``): what was yielded is complete. Or drain: once ``stop_starting()`` is true (asked
        at checks) no new prompt starts and those in flight finish (at most ``max_new`` more steps), so a
        time limit does not throw away the long answers it caught mid-way.
        """
        n = len(prompts)
        if n == 0 or max_new <= 0:
            return
        c, dev, dtype = self.cfg, self.device, self.tok_embd.dtype
        b = min(slots, n)
        width = max(len(p) for p in prompts) + max_new
        caches = [
            (
                torch.zeros(b, c.n_head_kv, width, c.head_dim, device=dev, dtype=dtype),
                torch.zeros(b, c.n_head_kv, width, c.head_dim, device=dev, dtype=dtype),
            )
            for _ in range(c.n_layer)
        ]
        out = torch.zeros(b, max_new, dtype=torch.long, device=dev)
        stop_t = torch.tensor(list(stop) or [-1], device=dev)
        ar = torch.arange(b, device=dev)
        cols = torch.arange(width, device=dev)
        rep, scale = c.n_head // c.n_head_kv, c.head_dim**-0.5
        # per slot: tokens in its cache (host mirror + device copy), tokens produced, the prompt it runs
        lens_h = np.zeros(b, dtype=np.int64)
        gen_h = np.zeros(b, dtype=np.int64)
        owner = np.full(b, -1, dtype=np.int64)
        lens_d = torch.zeros(b, dtype=torch.long, device=dev)
        gen_d = torch.zeros(b, dtype=torch.long, device=dev)
        fin = torch.ones(b, dtype=torch.bool, device=dev)
        cur = torch.zeros(b, dtype=torch.long, device=dev)
        nxt_prompt = 0

        def pick(lg: torch.Tensor) -> torch.Tensor:
            if temperature > 0:
                return torch.multinomial(torch.softmax(lg / temperature, -1), 1, generator=generator)[:, 0]
            return lg.argmax(-1)

        def refill(free: list[int]) -> None:
            nonlocal nxt_prompt
            take = free[: n - nxt_prompt]
            for s in free[len(take) :]:  # nothing left to run: the slot idles (its rows stay in bounds)
                owner[s], lens_h[s], gen_h[s] = -1, 0, 0
            if take:
                idx = list(range(nxt_prompt, nxt_prompt + len(take)))
                nxt_prompt += len(take)
                tok = pick(self._prefill(take, [prompts[i] for i in idx], caches))
                rows = torch.tensor(take, device=dev)
                out[rows, 0] = tok
                cur[rows] = tok
                fin[rows] = torch.isin(tok, stop_t)
                for s, i in zip(take, idx):
                    owner[s], lens_h[s], gen_h[s] = i, len(prompts[i]), 1
            idle = [s for s in free[len(take) :]]
            if idle:
                fin[torch.tensor(idle, device=dev)] = True
            lens_d.copy_(torch.from_numpy(lens_h))
            gen_d.copy_(torch.from_numpy(gen_h))

        refill(list(range(b)))
        since = 0
        while True:
            live = owner >= 0
            if not live.any():
                return
            if since >= check_every or (gen_h[live] >= max_new).any():
                since = 0
                if stop_starting is not None and nxt_prompt < n and stop_starting():
                    nxt_prompt = n
                done = np.flatnonzero(live & (fin.cpu().numpy() | (gen_h >= max_new))).tolist()
                if done:
                    rows = out[torch.tensor(done, device=dev)].tolist()
                    for s, row in zip(done, rows):
                        seq = []
                        for tok in row[: gen_h[s]]:
                            seq.append(tok)
                            if tok in stop:
                                break
                        yield int(owner[s]), seq
                    refill(done)
                    continue
            # one decode step for the whole pool: feed each slot's last token at its own column
            span = int(lens_h.max()) + 1
            pos = lens_d[:, None]
            attend = (cols[None, :span] <= lens_d[:, None])[:, None, None, :]  # [B, 1, 1, span]
            x = F.embedding(cur[:, None], self.tok_embd)
            for il in range(c.n_layer):
                q, k, v = self._qkv(il, x, pos)
                ck, cv = caches[il]
                ck[ar, :, lens_d] = k[:, 0]
                cv[ar, :, lens_d] = v[:, 0]
                # grouped-query attention without repeating the cache: [B, Hkv, rep, D] x [B, Hkv, span, D]
                qg = q.view(b, c.n_head_kv, rep, c.head_dim)
                sc = (qg @ ck[:, :, :span].transpose(-1, -2)).float() * scale
                sc = sc.masked_fill(~attend, float("-inf"))
                o = torch.softmax(sc, -1).to(dtype) @ cv[:, :, :span]
                x = self._post(il, x, o.reshape(b, 1, c.n_head * c.head_dim))
            h = _rms(x[:, 0], self.w["output_norm.weight"], c.eps)
            tok = pick((h @ self.head.T).float())
            lens_d += 1
            lens_h += 1
            out[ar, gen_d.clamp(max=max_new - 1)] = tok
            gen_d += 1
            gen_h += 1
            cur = tok
            fin |= torch.isin(tok, stop_t)
            since += 1

    def generate_continuous(
        self, prompts: Sequence[Sequence[int]], max_new: int, stop: Sequence[int], slots: int = 256, **kw
    ) -> list[list[int]]:  # type: ignore[no-untyped-def]
        """``generate``'s answers, in order, computed by ``generate_stream``."""
        res: list[list[int]] = [[] for _ in prompts]
        for i, seq in self.generate_stream(prompts, max_new, stop, slots, **kw):
            res[i] = seq
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
