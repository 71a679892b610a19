"""Task heads that read a sequence embedding (the KA's [CLS] output, or a baseline's).

* :class:`ClassificationHead`: binary or C-way classification (BERT's pooler shape:
  dense -> tanh -> dropout -> linear to ``n_classes`` logits). Binary tasks use two logits and
  softmax cross-entropy, so one code path serves both.
  With ``config.value_counts`` the head is *wide and deep* (Cheng et al. 2016): a linear layer
  over the sequence's bag of values (seqenc.sequences.TokenizedSequences.value_count_bags: log(1
  + count) of every hashed (key, value) pair) adds its logits to the deep ones. A logistic
  regression on those counts is then a special case of the model, and the KA is left to learn
  what counts miss (order, co-occurrence across keys). Why: on milestone a logistic regression on
  the counts of every key=value pair beat the plain head (macro F1 0.619 against 0.572, seeds
  10-14); with the wide part, dev macro F1 0.650 against 0.594 (seeds 0-2) and test 0.630
  (docs/training.md). Choice: the wide weights start at zero (the first logits are the
  KA's) and are learned with the KA's optimiser, at WIDE_WEIGHT_SCALE times its learning rate.
* :class:`NextItemHead`: next-item prediction as *retrieval* over a catalogue. Every catalogue
  item has a learned embedding e_i; the sequence embedding is projected to a query q and the
  score of item i is q . e_i + b_i. Training is softmax cross-entropy over the whole catalogue
  (the paper's Instacart task is "a classification task over a universe of 3212 products");
  :meth:`NextItemHead.top_k` returns the k best items. Choice: item embeddings are their own
  table (not tied to the TVM's word embeddings), so item ids need no tokenisation;
  :meth:`NextItemHead.init_items` can seed them, e.g. with the mean TVM embedding of each item
  name's tokens.

  With ``config.item_history`` (next_item tasks by default) the head is a mixture of two
  distributions, as RepeatNet's (Ren et al. 2019) repeat and explore modes:

      P(i) = P(repeat) * softmax_{j held}(w . f_j)_i  +  P(explore) * softmax_j(q . e_j + b_j)_i

  where f_i are the :data:`HISTORY_FEATURES` of item i in the sequence's own history
  (seqenc.sequences.item_histories: log(1 + times it occurs among the item key's values), how
  recently it last occurred (1 = the last value), and log(1 + times it directly followed the
  sequence's last item: a personal first-order transition, as FPMC's), the repeat softmax runs
  over the items the sequence holds only, w are three learned weights, and P(repeat) =
  sigmoid(g . h + g0) is read from the KA's embedding (a sequence that holds no item explores).
  Why: in purchase, click or job histories most next items are items the sequence already holds,
  and a head that must rediscover every item's identity from the KA's embedding learns it from a
  few examples per item at best. Measured (next_item bench, demo size, seed 0, dev): the plain
  head's scores ranked the next item at recall@10 0.07 (chance 0.05) while ranking each user's
  own items by count alone gives 0.93; a head that *adds* w . f_i to q . e_i let that noise
  reorder the held items (0.70). In the mixture the explore scores only move probability onto
  items beyond the history. The forward pass returns log P(i) (the "logits" of the loss and of
  top-k). w starts at (3, 0, 0): the first repeat ranking is by count.

:func:`make_head` picks the head from ``config.task``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqenc.config import TVMKAConfig
from seqenc.sequences import HISTORY_FEATURES

# the wide weights are learned as w / WIDE_WEIGHT_SCALE (as HISTORY_WEIGHT_SCALE below: a logistic
# regression's weights are of order 1, more than the KA's learning rate moves a parameter)
WIDE_WEIGHT_SCALE = 10.0


class ClassificationHead(nn.Module):
    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(config.d_model, config.n_classes)
        self.wide = None
        if config.value_counts:  # the wide part of the module docstring
            self.wide = nn.EmbeddingBag(config.value_counts, config.n_classes, mode="sum")
            nn.init.zeros_(self.wide.weight)  # seqenc.model.init_weights leaves an EmbeddingBag alone

    def forward(self, h: torch.Tensor, bags: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        # h: [B, d_model], bags: (buckets [N], offsets [B], weights [N]) where config.value_counts
        # -> [B, n_classes] logits
        logits = self.out(self.dropout(torch.tanh(self.dense(h))))
        if self.wide is None:
            return logits
        if bags is None:
            raise ValueError("this head reads the bag of values (config.value_counts): pass the (buckets, offsets, "
                             "weights) of seqenc.sequences.TokenizedSequences.value_count_bags")
        buckets, offsets, weights = bags
        wide = self.wide(buckets, offsets, per_sample_weights=weights.to(self.wide.weight.dtype))
        return logits + (wide * WIDE_WEIGHT_SCALE).to(logits.dtype)


# w is learned as w / 10: an optimiser step moves a parameter by about its learning rate, and the
# KA's (5e-4, a few thousand steps) would leave w near its start (a learning-rate multiplier of 10)
HISTORY_WEIGHT_SCALE = 10.0
NOT_HELD = -1e4  # the repeat score of an item the sequence does not hold (finite: fp16-safe)


class NextItemHead(nn.Module):
    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.query = nn.Linear(config.d_model, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.items = nn.Embedding(config.n_items, config.d_model)
        self.item_bias = nn.Parameter(torch.zeros(config.n_items))
        self.history_weight = self.repeat_gate = None
        if config.item_history:  # the repeat mode of the module docstring
            start = torch.zeros(len(HISTORY_FEATURES))
            start[0] = 3.0
            self.history_weight = nn.Parameter(start / HISTORY_WEIGHT_SCALE)
            self.repeat_gate = nn.Linear(config.d_model, 1)

    def forward(self, h: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        # h: [B, d_model], history: [B, n_items, len(HISTORY_FEATURES)] -> [B, n_items] scores
        # (logits of a softmax over the catalogue; with the item history, log-probabilities)
        q = self.dropout(self.norm(self.query(h)))
        explore = q @ self.items.weight.T + self.item_bias
        if self.history_weight is None:
            return explore
        if history is None:
            raise ValueError("this next-item head reads the item history (config.item_history): pass the "
                             "[B, n_items, len(HISTORY_FEATURES)] features of "
                             "seqenc.sequences.TokenizedSequences.history_features")
        history = history.to(explore.dtype)
        held = history[..., 0] > 0  # [B, n_items]: log(1 + count) > 0
        any_held = held.any(-1, keepdim=True)  # [B, 1]
        w = (self.history_weight * HISTORY_WEIGHT_SCALE).to(explore.dtype)
        repeat = (history @ w).masked_fill(~held, NOT_HELD).log_softmax(-1)
        gate = self.repeat_gate(h).to(explore.dtype)  # [B, 1]: logit of P(repeat)
        log_repeat = torch.where(any_held, repeat + F.logsigmoid(gate), torch.full_like(repeat, NOT_HELD))
        log_explore = explore.log_softmax(-1) + torch.where(any_held, F.logsigmoid(-gate), torch.zeros_like(gate))
        return torch.logaddexp(log_repeat, log_explore)

    @torch.no_grad()
    def top_k(self, h: torch.Tensor, k: int, exclude: torch.Tensor | None = None,
              history: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The k best items per row: (scores [B, k], item ids [B, k]), best first.

        ``exclude`` ([B, n_items] bool) removes items from the ranking, e.g. already seen ones.
        """
        scores = self(h, history)
        if exclude is not None:
            scores = scores.masked_fill(exclude, float("-inf"))
        return scores.topk(min(k, scores.size(-1)), dim=-1)

    @torch.no_grad()
    def init_items(self, vectors: torch.Tensor) -> None:
        """Seed the item embeddings with [n_items, d_model] vectors."""
        if vectors.shape != self.items.weight.shape:
            raise ValueError(f"expected {tuple(self.items.weight.shape)}, got {tuple(vectors.shape)}")
        self.items.weight.copy_(vectors)


class WideHead(nn.Module):
    """The wide part of a table encoder's classifier (``TableConfig.table_wide``): features [B, F]
    -> logits [B, n_outputs], added to the deep head's logits. ``kind`` (``TableConfig.table_wide_head``,
    seqenc.config.TABLE_WIDE_HEADS):

    * ``"linear"``: ``WIDE_SCALE * (W f + b)``, W and b zero at init. Why the scale: a logistic
      regression on word-overlap shares (which differ by a few hundredths between a true and a
      false statement) needs weights of ~10, and Adam moves a weight by about the learning rate per
      update -- 10,000 updates at 1e-3; the scale multiplies that pace, as TableFormer's relation
      scalars do (seqenc.structure.TableFormerBias).
    * ``"mlp"``: the features standardised first (a batch norm without its own scale: running mean
      and variance, updated in training, used in evaluation; a batch of one uses them as they
      are), then the linear part above plus one hidden layer of ``WIDE_HIDDEN`` GELU units whose
      output layer starts at zero -- so the first logits are still the deep head's. Why: the
      features mix shares, counts and 0/1 checks on different scales, and the checks combine
      (a superlative word and the named row at the extreme). Chosen on TabFact's dev split
      (seed 0, the head alone on the "checks" features at the bench's 1,500 updates and rate
      1e-3, three initialisations; docs/tables.md): linear 0.620, standardised linear 0.633,
      standardised linear + hidden layer 0.643."""

    def __init__(self, n_features: int, n_outputs: int, kind: str = "linear"):
        super().__init__()
        self.linear = nn.Linear(n_features, n_outputs)
        self.mlp = nn.Sequential(nn.Linear(n_features, WIDE_HIDDEN), nn.GELU(), nn.Linear(WIDE_HIDDEN, n_outputs)) \
            if kind == "mlp" else None
        if self.mlp is not None:
            self.register_buffer("running_mean", torch.zeros(n_features))
            self.register_buffer("running_var", torch.ones(n_features))
            # 1 once the trainer has fitted the head alone (training.engine.end_to_end.fit_wide_head):
            # saved with the weights, so a resumed run does not fit it twice
            self.register_buffer("fitted", torch.zeros((), dtype=torch.long))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        if self.mlp is not None:
            self.mlp[0].reset_parameters()  # PyTorch's default (Kaiming uniform), not the encoder's normal
            nn.init.zeros_(self.mlp[2].weight)
            nn.init.zeros_(self.mlp[2].bias)
            self.running_mean.zero_()
            self.running_var.fill_(1.0)
            self.fitted.zero_()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.mlp is None:
            return WIDE_SCALE * self.linear(features)
        x = nn.functional.batch_norm(features.float(), self.running_mean, self.running_var,
                                     training=self.training and features.size(0) > 1, momentum=0.1)
        return WIDE_SCALE * self.linear(x) + self.mlp(x)


WIDE_HIDDEN = 64
WIDE_SCALE = 30.0


def make_head(config: TVMKAConfig) -> nn.Module:
    return NextItemHead(config) if config.task == "next_item" else ClassificationHead(config)
