"""DT-Fixup (Xu et al., 2021, "Optimizing Deeper Transformers on Small Datasets", section 3.3).

New transformer layers trained on top of a pre-trained encoder -- here the KA over a MiniLM
TVM, and the ``table_new_layers`` over a MiniLM table encoder (seqenc.table_model) -- start so
small that a gradient step changes the model's output by Theta(eta) whatever their depth N, so they train without learning-rate warm-up and without LayerNorm:

1. Xavier initialisation of every new parameter (:func:`xavier_init`; loaded weights keep theirs);
2. no warm-up and no LayerNorm inside the new layers (``seqenc.model.Layer(norm=False)``; the
   trainer gives the KA no warm-up, training.engine.trainer);
3. mu = max_j ||x_j||, the largest input norm over a forward pass on all training examples
   (:func:`input_norm_bound`);
4. inside each new layer, the attention's value and output projections (v, w) and both MLP
   matrices scaled by :func:`dt_fixup_factor` (Theorem 3.1): N^-1/2 / (2 mu) for vanilla
   layers, (N (4 mu^2 + 2 mu + 2))^-1/2 for relation-aware layers (value relations r^v too).

Choices where the paper is vague (written down here and in docs/model.md):

* "input x_j": the vector of one position at the new stack's input. For the KA that is a row of
  ``[CLS; standardised KR(k)...]`` after the KA's input LayerNorm (``KeyAggregator.inputs``,
  dropout off), over the real positions of every training sequence; mu is measured once, at the
  first KR refresh (the TVM's KRs exist only then), and kept in the buffer ``ka.fixup_mu`` so a
  resumed run neither measures nor scales twice.
* Shared heads: KA layer i shares heads with TVM layer i (TVMKAConfig.n_shared_heads); those
  Q/K/V rows belong to the pre-trained TVM and are neither re-initialised nor scaled -- the KA's
  own value rows, its output projection W^O (which every head's output passes through) and
  its MLP are.
* Biases start at zero (Xavier's usual companion); the KA's input LayerNorm and its task head
  are not transformer layers and keep theirs.
* The KA's learned [CLS] input vector starts as N(0, 1) instead of 0. The head reads position 0,
  and with no LayerNorm in the layers a [CLS] of 0 leaves the scaled-down layers as a vector
  near 0: measured on a seeded 4-key task over MiniLM KRs (16 layers, lr 3e-4, no warm-up,
  120 steps), the KA stayed at chance (loss 0.696, test accuracy 0.50) with a zero [CLS] and
  reached accuracy 1.0 with N(0, 1) (the input LayerNorm makes its scale irrelevant).
* Our KA layers are vanilla (no relation vectors), so the vanilla factor applies; the
  relation-aware factor is there for layers that add value relations r^v.
* Table encoders: x_j is a real position of the last pre-trained layer's output (the new
  layers' input), over every training example, measured before the first step; TableFormer's
  relations are scalar biases on the scores with no value relation r^v, so its new layers use
  the vanilla factor too. The [CLS] is a real token here (no learned input vector to redraw);
  the relation scalars and the head keep their init. MAFiD's model gets no DT-Fixup: its new
  layers are gated and start closed (seqenc.mafid), which already makes them start as the identity.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

log = logging.getLogger(__name__)


def dt_fixup_factor(mu: float, depth: int, relation_aware: bool = False) -> float:
    """Theorem 3.1's scale for the weights of each of ``depth`` new layers, given the input norm mu."""
    if depth < 1 or mu <= 0:
        raise ValueError(f"DT-Fixup needs depth >= 1 and mu > 0, got depth={depth}, mu={mu}")
    if relation_aware:
        return (depth * (4 * mu**2 + 2 * mu + 2)) ** -0.5
    return depth**-0.5 / (2 * mu)


def _own_linears(layer: nn.Module):
    """``(name, Linear)`` of a layer's own linear maps: shared heads (``attn.shared``) excluded."""
    for name, m in layer.named_modules():
        if isinstance(m, nn.Linear) and ".shared." not in f".{name}.":
            yield name, m


@torch.no_grad()
def xavier_init(stack: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every own linear map of ``stack``'s layers."""
    for _, m in _own_linears(stack):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


@torch.no_grad()
def prepare_key_aggregator(ka) -> None:
    """Step 1 for a KA built with ``ka_init = "dt_fixup"``: Xavier on its layers, and its [CLS]
    input vector drawn from N(0, 1) (the choice in the module docstring)."""
    xavier_init(ka.encoder)
    nn.init.normal_(ka.cls)


@torch.no_grad()
def input_norm_bound(vectors) -> float:
    """mu = max_j ||x_j||: ``vectors`` yields ``(x [B, L, d], mask [B, L] bool)`` batches."""
    mu = 0.0
    for x, mask in vectors:
        norms = x.float().norm(dim=-1)[mask]
        if norms.numel():
            mu = max(mu, float(norms.max()))
    if not math.isfinite(mu) or mu <= 0:
        raise ValueError(f"DT-Fixup: the measured input norm is {mu}; the stack's inputs are all zero or not finite")
    return mu


SCALED = ("attn.value", "attn.output", "ffn_in", "ffn_out")  # v, w and the MLP (seqenc.model.Layer)


@torch.no_grad()
def apply_dt_fixup(layers, mu: float, relation_aware: bool = False) -> float:
    """Scale v, w and the MLP matrices of each layer of ``layers`` (a sequence of
    seqenc.model.Layer) by Theorem 3.1's factor for their depth; returns the factor."""
    factor = dt_fixup_factor(mu, len(layers), relation_aware)
    for layer in layers:
        for name, m in _own_linears(layer):
            if name in SCALED:
                m.weight.mul_(factor)
    log.info("DT-Fixup: %d layers, input norm mu = %.3f, weights of v, w and the MLP scaled by %.3g",
             len(layers), mu, factor)
    return factor


@torch.no_grad()
def fixup_key_aggregator(ka, batches) -> float:
    """Measure the KA's input norm on ``batches`` of ``(key_reprs, key_mask)`` (training
    sequences), scale its layers, record mu in ``ka.fixup_mu``; a KA already scaled is left
    alone. Returns mu."""
    return _fixup_once(ka, ka.encoder.layers, (ka.inputs(kr, mask) for kr, mask in batches))


@torch.no_grad()
def fixup_table_encoder(model, batches) -> float:
    """The same for a table encoder (seqenc.table_model.TableTextEncoder, ``table_init =
    "dt_fixup"``): mu over the real positions of the new layers' input -- the pre-trained
    layers' output -- on ``batches`` of forward's inputs (training examples); its
    ``table_new_layers`` scaled by the vanilla factor, once. Returns mu."""
    return _fixup_once(model, model.new_layers,
                       ((model.hidden(*inputs[:model.MASK_INPUT + 1], new_layers=False), inputs[model.MASK_INPUT])
                        for inputs in batches))


def _fixup_once(owner: nn.Module, layers, vectors) -> float:
    """mu over ``vectors`` (a lazy iterable of ``(x, mask)``, computed with ``owner`` in eval
    mode), ``layers`` scaled, mu kept in ``owner.fixup_mu``; nothing if that is already set."""
    if float(owner.fixup_mu) > 0:
        return float(owner.fixup_mu)
    was_training = owner.training
    owner.eval()
    mu = input_norm_bound(vectors)
    owner.train(was_training)
    apply_dt_fixup(layers, mu)
    owner.fixup_mu.fill_(mu)
    return mu
