"""Multi-head self-attention with heads shared between two networks, and DropHead.

The attention *core* (scores, additive bias, softmax, weighted sum) is separated from the
*projections*, and the core is picked from a registry by ``config.attn_backend``:

* ``"eager"``: plain matmul + softmax, easy to read and to debug;
* ``"sdpa"``:  ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels).

Mask convention (one place): callers pass a boolean ``attention_mask`` of shape [B, L] with
``True`` for real tokens and ``False`` for padding. :func:`additive_mask` turns it into the
additive bias [B, 1, 1, L] (0 for real tokens, a large negative number for padding) that both
backends add to the attention scores. Nothing else in the package converts masks.

Head sharing (TVM-KA paper, section 2, "Sharing Attention Heads"): with h = p + q heads, the
Q/K/V projections of heads 1..p live in a :class:`SharedHeadProjections` module that the TVM and
the KA both hold (the very same ``Parameter`` objects); heads p+1..h and the output projection
W^O are private to each network. The shared heads are always the *first* p heads, so a BERT
checkpoint's Q/K/V matrices split row-wise into [shared | private].

DropHead (Zhou et al., 2020) drops whole heads. Here it touches only the shared heads and only
in a network built with ``drophead > 0`` (the TVM) in training mode. Choice: each shared head
of each example is dropped independently with probability ``drophead`` and the kept ones are
scaled by ``1 / (1 - drophead)`` (inverted-dropout scaling), which keeps the expectation of
every head's output exactly unchanged; the paper's "rescale the rest" by h / #kept is only
approximately unbiased and undefined when all heads drop.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from seqenc.config import TVMKAConfig


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """[B, L] bool (True = attend) -> [B, 1, 1, L] additive bias (0 or a large negative)."""
    if attention_mask is None:
        return None
    if attention_mask.dtype != torch.bool:
        raise TypeError(f"attention_mask must be bool (True = real token), got {attention_mask.dtype}")
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    bias = bias.masked_fill(~attention_mask, torch.finfo(dtype).min)
    return bias[:, None, None, :]


# --- attention cores -----------------------------------------------------------------------
# Each core takes q, k, v: [B, h, L, d_head] and bias: [B, 1|h, L|1, L] or None,
# and returns [B, h, L, d_head].


def eager_attention(q, k, v, bias, dropout_p: float, training: bool):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # [B, h, L, L]
    if bias is not None:
        scores = scores + bias
    probs = scores.softmax(dim=-1)
    probs = F.dropout(probs, p=dropout_p, training=training)
    return probs @ v


def sdpa_attention(q, k, v, bias, dropout_p: float, training: bool):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=dropout_p if training else 0.0
    )


ATTENTION_BACKENDS: dict[str, Callable] = {"eager": eager_attention, "sdpa": sdpa_attention}


def get_backend(name: str) -> Callable:
    try:
        return ATTENTION_BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; choose from {sorted(ATTENTION_BACKENDS)}") from None


# --- projections -------------------------------------------------------------------------------


class SharedHeadProjections(nn.Module):
    """Q/K/V weights of the p shared heads of one layer; held by both the TVM and the KA."""

    def __init__(self, config: TVMKAConfig):
        super().__init__()
        width = config.n_shared_heads * config.d_head
        self.query = nn.Linear(config.d_model, width)
        self.key = nn.Linear(config.d_model, width)
        self.value = nn.Linear(config.d_model, width)


class SelfAttention(nn.Module):
    """h = p shared + q private heads, private output projection W^O, optional DropHead."""

    def __init__(self, config: TVMKAConfig, shared: SharedHeadProjections | None, drophead: float):
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.n_shared = config.n_shared_heads if shared is not None else 0
        if shared is not None and config.n_shared_heads == 0:
            raise ValueError("SharedHeadProjections given, but n_shared_heads is 0")
        # no SharedHeadProjections: every head private (a KA deeper than the TVM, seqenc.model)
        self.shared = shared
        private = (self.n_heads - self.n_shared) * self.d_head
        self.query = nn.Linear(config.d_model, private) if private else None
        self.key = nn.Linear(config.d_model, private) if private else None
        self.value = nn.Linear(config.d_model, private) if private else None
        self.output = nn.Linear(config.d_model, config.d_model)  # W^O, private
        self.attn_dropout = config.attn_dropout
        self.drophead = drophead
        self.core = get_backend(config.attn_backend)

    def _project(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """[B, L, d_model] -> [B, h, L, d_head], shared heads first."""
        parts = []
        if self.shared is not None:
            parts.append(getattr(self.shared, name)(x))
        private = getattr(self, name)
        if private is not None:
            parts.append(private(x))
        y = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        B, L, _ = y.shape
        return y.view(B, L, self.n_heads, self.d_head).transpose(1, 2)

    def drophead_scale(self, batch_size: int, device, dtype) -> torch.Tensor | None:
        """[B, h, 1, 1] per-head multipliers, or None when DropHead is inactive."""
        if not (self.training and self.drophead > 0 and self.n_shared > 0):
            return None
        keep = torch.rand(batch_size, self.n_shared, device=device) >= self.drophead
        scale = torch.ones(batch_size, self.n_heads, device=device, dtype=dtype)
        scale[:, : self.n_shared] = keep.to(dtype) / (1.0 - self.drophead)
        return scale[:, :, None, None]

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, attend: Callable | None = None,
                context: torch.Tensor | None = None) -> torch.Tensor:
        # x: [B, L, d_model]; bias: additive, [B, 1|h, 1|L, Lc], or None. ``attend(q, k, v,
        # dropout_p, training)`` replaces the core and the bias (MATE's bucketed attention,
        # seqenc.structure.mate_attention, which never builds an L x L matrix). ``context``
        # [B, Lc, d_model]: keys and values come from it (cross-attention); default x itself.
        source = x if context is None else context
        q, k, v = self._project(x, "query"), self._project(source, "key"), self._project(source, "value")
        if attend is not None:
            heads = attend(q, k, v, self.attn_dropout, self.training)
        else:
            heads = self.core(q, k, v, bias, self.attn_dropout, self.training)  # [B, h, L, d_head]
        scale = self.drophead_scale(x.size(0), x.device, heads.dtype)
        if scale is not None:
            heads = heads * scale
        B, _, L, _ = heads.shape
        return self.output(heads.transpose(1, 2).reshape(B, L, -1))  # [B, L, d_model]
