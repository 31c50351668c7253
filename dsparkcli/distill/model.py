"""The DSpark draft exactly as llama.cpp 0c1e570 runs it (src/models/dflash.cpp, common/speculative.cpp).

One draft call at anchor position ``a`` (the last committed token, not yet seen by the target):

* context: for every earlier position p < a, the target's tapped layer inputs are concatenated
  (``nt * E``), passed through ``fc`` and ``hidden_norm`` (GGUF ``enc.output_norm``), and become extra
  K/V in every draft layer through that layer's own ``wk`` (+ ``k_norm``, RoPE at p) and ``wv``. No
  ``attn_norm`` is applied to them (the engine injects ``inp_g`` straight into wk/wv).
* block: ``[x_a, MASK x (k-1)]`` at positions a..a+k-1, embedded with the TARGET's token table; each
  layer: rms attn_norm, Q/K/V, per-head rms q/k norms, NEOX RoPE, attention over context + block
  (we write ``dflash.attention.causal = true``: slot i sees block slots <= i, so a slot's output does
  not depend on the budget k), residual, rms ffn_norm, SwiGLU, residual; final rms norm; the target's
  head (tied SmolLM2: its token table).
* Markov head: ``col_i = base_i + W2 @ W1[prev_i]`` with prev_0 = x_a and prev_i = argmax(col_{i-1})
  (greedy chain in the graph). Slot i proposes the token at a+i+1 (anchor-first DSpark).
* confidence head: ``sigmoid(conf . [t_embd_i ; W1[prev_i]] + b)``; llama.cpp stops a draft at the
  first slot whose confidence is below ``--spec-draft-p-min``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dsparkcli.distill.target import _rms, rope


@dataclass(frozen=True)
class DraftConfig:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: int
    taps: tuple[int, ...]  # llama.cpp ids: layer INPUTS of the target
    block_size: int
    markov_rank: int
    rope_base: float
    eps: float
    mask_token_id: int
    context_length: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["taps"] = list(self.taps)
        return d

    @staticmethod
    def from_dict(d: dict) -> DraftConfig:
        return DraftConfig(**{**d, "taps": tuple(d["taps"])})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x.float(), self.weight.float(), self.eps).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        e, d = c.n_embd, c.head_dim
        self.attn_norm = RMSNorm(e, c.eps)
        self.wq = nn.Linear(e, c.n_head * d, bias=False)
        self.wk = nn.Linear(e, c.n_head_kv * d, bias=False)
        self.wv = nn.Linear(e, c.n_head_kv * d, bias=False)
        self.wo = nn.Linear(c.n_head * d, e, bias=False)
        self.q_norm = RMSNorm(d, c.eps)
        self.k_norm = RMSNorm(d, c.eps)
        self.ffn_norm = RMSNorm(e, c.eps)
        self.gate = nn.Linear(e, c.n_ff, bias=False)
        self.up = nn.Linear(e, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, e, bias=False)


class DSparkDraft(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.cfg = c
        e = c.n_embd
        self.fc = nn.Linear(len(c.taps) * e, e, bias=False)
        self.hidden_norm = RMSNorm(e, c.eps)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(e, c.eps)
        self.markov_w1 = nn.Embedding(c.vocab, c.markov_rank)
        self.markov_w2 = nn.Linear(c.markov_rank, c.vocab, bias=False)
        self.conf = nn.Linear(e + c.markov_rank, 1)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.markov_w1.weight, std=std)
        nn.init.zeros_(self.markov_w2.weight)  # start as a plain DFlash draft; the bias is learnt
        for layer in self.layers:
            nn.init.zeros_(layer.wo.weight)  # residual branches start closed: the draft begins at embed->head
            nn.init.zeros_(layer.down.weight)

    # -------------------------------------------------------------- the backbone

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [B, T, nt*E] -> the injected context rows [B, T, E] (fc, hidden_norm)."""
        return self.hidden_norm(self.fc(feats))

    def backbone(
        self,
        block_emb: torch.Tensor,
        block_pos: torch.Tensor,
        ctx: torch.Tensor,
        ctx_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Block embeddings [B, N, E] at block_pos [B, N]; context rows [B, T, E] at ctx_pos [B, T];
        mask [B or 1, N, T + N] (True = may attend). Returns t_embd [B, N, E] (after the final norm)."""
        c = self.cfg
        b, n, _ = block_emb.shape
        t = ctx.shape[1]
        x = block_emb
        rep = c.n_head // c.n_head_kv
        for layer in self.layers:
            h = layer.attn_norm(x)
            q = layer.q_norm(layer.wq(h).view(b, n, c.n_head, c.head_dim))
            kb = layer.k_norm(layer.wk(h).view(b, n, c.n_head_kv, c.head_dim))
            vb = layer.wv(h).view(b, n, c.n_head_kv, c.head_dim)
            kc = layer.k_norm(layer.wk(ctx).view(b, t, c.n_head_kv, c.head_dim))
            vc = layer.wv(ctx).view(b, t, c.n_head_kv, c.head_dim)
            q = rope(q, block_pos, c.rope_base, "neox")
            kb = rope(kb, block_pos, c.rope_base, "neox")
            kc = rope(kc, ctx_pos, c.rope_base, "neox")
            k = torch.cat((kc, kb), 1).transpose(1, 2).repeat_interleave(rep, dim=1)
            v = torch.cat((vc, vb), 1).transpose(1, 2).repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None])
            x = x + layer.wo(o.transpose(1, 2).reshape(b, n, c.n_head * c.head_dim))
            h = layer.ffn_norm(x)
            x = x + layer.down(F.silu(layer.gate(h)) * layer.up(h))
        return self.norm(x)

    def markov_bias(self, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w1 = self.markov_w1(prev)
        return self.markov_w2(w1), w1

    def confidence(self, t_embd: torch.Tensor, w1_prev: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.conf(torch.cat((t_embd, w1_prev), -1))).squeeze(-1)

    # -------------------------------------------------------------- blocks at anchors

    def blocks(
        self, tokens: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor, size: int, embed: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run blocks of ``size`` slots at ``anchors`` [B, A] of each sequence (tokens [B, T]).

        Returns (t_embd [B, A, size, E], block positions [B, A, size]). Block a sees context rows p < a
        and its own slots causally; blocks never see each other (one draft call each).
        """
        b, t = tokens.shape
        a = anchors.shape[1]
        dev = tokens.device
        slot = torch.arange(size, device=dev)
        pos = anchors[:, :, None] + slot  # [B, A, S]
        blk_tok = torch.full((b, a, size), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        blk_tok[:, :, 0] = tokens.gather(1, anchors)
        emb = F.embedding(blk_tok, embed).to(feats.dtype).view(b, a * size, -1)
        ctx = self.context(feats)
        ctx_pos = torch.arange(t, device=dev).expand(b, t)
        # context column p visible to every slot of block a iff p < anchor
        m_ctx = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]  # [B, A, T]
        m_ctx = m_ctx[:, :, None, :].expand(b, a, size, t).reshape(b, a * size, t)
        same = torch.eye(a, dtype=torch.bool, device=dev)[:, None, :, None]  # [A,1,A,1]
        causal = (slot[None, :] <= slot[:, None])[None, :, None, :]  # [1,S,1,S]
        m_blk = (same & causal).reshape(a * size, a * size)
        mask = torch.cat((m_ctx, m_blk[None].expand(b, -1, -1)), dim=-1)
        out = self.backbone(emb, pos.view(b, a * size), ctx, ctx_pos, mask)
        return out.view(b, a, size, -1), pos

    @torch.no_grad()
    def propose(
        self,
        tokens: torch.Tensor,
        feats: torch.Tensor,
        anchors: torch.Tensor,
        size: int,
        embed: torch.Tensor,
        head: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What llama.cpp drafts at each anchor with budget ``size``: the greedy Markov chain.

        Returns (proposals [B, A, size], confidences [B, A, size])."""
        te, _ = self.blocks(tokens, feats, anchors, size, embed)
        base = te.float() @ head.float().T  # [B, A, S, V]
        prev = tokens.gather(1, anchors)
        props, confs = [], []
        for i in range(size):
            bias, w1 = self.markov_bias(prev)
            col = base[:, :, i] + bias.float()
            confs.append(self.confidence(te[:, :, i], w1.to(te.dtype)).float())
            prev = col.argmax(-1)
            props.append(prev)
        return torch.stack(props, -1), torch.stack(confs, -1)
