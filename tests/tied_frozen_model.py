"""A small language model with tied, frozen and buffered state (tests/api/test_user_models.py,
tests/frontend/test_grad_clipping.py)."""

import torch
from torch import nn


class TiedFrozenBuffered(nn.Module):
    """GPT-2's tied head, a frozen layer, BatchNorm's running stats, BERT's position_ids."""

    def __init__(self, vocab=48, dim=32, seq=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.frozen = nn.Linear(dim, dim)
        self.frozen.requires_grad_(False)
        self.norm = nn.BatchNorm1d(seq)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("position_ids", torch.arange(seq), persistent=False)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids):
        h = self.emb(ids) + self.emb(self.position_ids)
        h = self.norm(torch.relu(self.frozen(h)))
        return self.head(torch.tanh(self.mix(h)) * self.scale)


def lm_loss(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def batches(n=3, vocab=48, seq=6, batch=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
            for _ in range(n)]


def model(seed=0):
    torch.manual_seed(seed)
    return TiedFrozenBuffered()
