"""Task heads that read a sequence embedding (the KA's [CLS] output, or a baseline's).

* :class:`ClassificationHead`: binary or C-way classification (BERT's pooler shape:
  dense -> tanh -> dropout -> linear to ``n_classes`` logits). Binary tasks use two logits and
  softmax cross-entropy, so one code path serves both.
* :class:`NextItemHead`: next-item prediction as *retrieval* over a catalogue. Every catalogue
  item has a learned embedding e_i; the sequence embedding is projected to a query q and the
  score of item i is q . e_i + b_i. Training is softmax cross-entropy over the whole catalogue
  (the paper's Instacart task is "a classification task over a universe of 3212 products");
  :meth:`NextItemHead.top_k` returns the k best items. Choice: item embeddings are their own
  table (not tied to the TVM's word embeddings), so item ids need no tokenisation;
  :meth:`NextItemHead.init_items` can seed them, e.g. with the mean TVM embedding of each item
  name's tokens.

:func:`make_head` picks the head from ``config.task``.
"""

from __future__ import annotations

import torch
from torch import nn

from seqenc.config import TVMKAConfig


class ClassificationHead(nn.Module):
    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(config.d_model, config.n_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h: [B, d_model] -> [B, n_classes] logits
        return self.out(self.dropout(torch.tanh(self.dense(h))))


class NextItemHead(nn.Module):
    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.query = nn.Linear(config.d_model, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.items = nn.Embedding(config.n_items, config.d_model)
        self.item_bias = nn.Parameter(torch.zeros(config.n_items))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # h: [B, d_model] -> [B, n_items] scores (logits of a softmax over the catalogue)
        q = self.dropout(self.norm(self.query(h)))
        return q @ self.items.weight.T + self.item_bias

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int, exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best items per row: (scores [B, k], item ids [B, k]), best first.

        ``exclude`` ([B, n_items] bool) removes items from the ranking, e.g. already seen ones.
        """
        scores = self(h)
        if exclude is not None:
            scores = scores.masked_fill(exclude, float("-inf"))
        return scores.topk(min(k, scores.size(-1)), dim=-1)

    @torch.no_grad()
    def init_items(self, vectors: torch.Tensor) -> None:
        """Seed the item embeddings with [n_items, d_model] vectors."""
        if vectors.shape != self.items.weight.shape:
            raise ValueError(f"expected {tuple(self.items.weight.shape)}, got {tuple(vectors.shape)}")
        self.items.weight.copy_(vectors)


def make_head(config: TVMKAConfig) -> nn.Module:
    return NextItemHead(config) if config.task == "next_item" else ClassificationHead(config)
