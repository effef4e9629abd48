"""GPT-style decoder-only transformer language model.

Token embedding (vocab) + learned positional embedding (seq_len positions),
N pre-LayerNorm blocks (x + Attn(LN(x)); x + FFN(LN(x))), final LayerNorm,
untied output projection to the vocabulary.  Attention is causal multi-head
self-attention written with plain matmul / masked_fill / softmax (no
``scaled_dot_product_attention``, no dropout); the FFN is
Linear(d, d_ff) - GELU - Linear(d_ff, d).

Defaults (N=8, d_model=512, h=8, d_ff=2048, vocab=20000) follow the AutoTM
paper's transformer settings.  Parameter count:
  vocab*d (embedding) + seq_len*d (positions) + N*(4d^2+4d + 2*d*d_ff+d_ff+d + 4d)
  + 2d (final LN) + d*vocab + vocab (head)
= 45,982,240 at seq_len=512 (it grows by d_model=512 per extra position).

Input: int64 token ids [batch, seq] with seq <= seq_len; output: logits
[batch, seq, vocab].  Use :class:`SequenceCrossEntropy` as the loss.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..errors import InputError

__all__ = ["GPT", "transformer", "SequenceCrossEntropy", "transformer_param_count"]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise InputError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.reshape(b, t, self.n_heads, self.d_head).transpose(1, 2)  # b h t dh
        k = k.reshape(b, t, self.n_heads, self.d_head).transpose(1, 2)
        v = v.reshape(b, t, self.n_heads, self.d_head).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(diagonal=1)
        att = att.masked_fill(mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v)  # b h t dh
        y = y.transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab: int = 20000,
        seq_len: int = 512,
        n_layers: int = 8,
        d_model: int = 512,
        n_heads: int = 8,
        d_ff: int = 2048,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_heads, d_ff) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.n_layers = n_layers
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re-)initialize every parameter (GPT-2 scheme)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()
        # Scaled init of the residual output projections.
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "ffn.fc2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layers))

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]
        if t > self.seq_len:
            raise InputError(f"sequence length {t} exceeds the model's seq_len={self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        x = self.blocks(x)
        return self.head(self.ln_f(x))


class SequenceCrossEntropy(nn.Module):
    """Cross entropy of logits [B, T, V] against int64 targets [B, T] (flattened)."""

    def __init__(self) -> None:
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        return self.ce(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def transformer(
    vocab: int = 20000,
    seq_len: int = 512,
    n_layers: int = 8,
    d_model: int = 512,
    n_heads: int = 8,
    d_ff: int = 2048,
) -> GPT:
    """Decoder-only transformer (N=8, d_model=512, h=8, d_ff=2048 by default)."""
    return GPT(vocab, seq_len, n_layers, d_model, n_heads, d_ff)


def transformer_param_count(
    vocab: int = 20000, seq_len: int = 512, n_layers: int = 8, d_model: int = 512, d_ff: int = 2048
) -> int:
    """Closed-form parameter count of :func:`transformer`."""
    d = d_model
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d) + 4 * d
    return vocab * d + seq_len * d + n_layers * block + 2 * d + d * vocab + vocab
