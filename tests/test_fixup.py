"""seqenc.fixup (DT-Fixup): Theorem 3.1's factors, which weights are scaled, the KA's input norm
measured on data, no LayerNorm in its layers, and a KA deeper than the TVM."""

import math

import pytest
import torch
from torch import nn

from seqenc.config import TVMKAConfig
from seqenc.fixup import apply_dt_fixup, dt_fixup_factor, fixup_key_aggregator, input_norm_bound
from seqenc.model import TVMKA


def config(**extra) -> TVMKAConfig:
    return TVMKAConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_shared_heads=2, d_ff=64, dropout=0.0,
                       attn_dropout=0.0, max_positions=16, **extra)


@pytest.mark.parametrize("depth", [1, 2, 8, 16, 48])
@pytest.mark.parametrize("mu", [1.5, 10.0, 19.6])
def test_factors_follow_theorem_3_1(depth, mu):
    assert dt_fixup_factor(mu, depth) == pytest.approx(1 / math.sqrt(4 * mu**2 * depth))
    assert dt_fixup_factor(mu, depth, relation_aware=True) == pytest.approx(
        1 / math.sqrt(depth * (4 * mu**2 + 2 * mu + 2)))
    assert dt_fixup_factor(mu, 4 * depth) == pytest.approx(dt_fixup_factor(mu, depth) / 2)  # N^-1/2
    with pytest.raises(ValueError):
        dt_fixup_factor(0.0, depth)


@pytest.mark.parametrize("depth", [1, 4, 16])
def test_v_w_and_the_mlp_of_each_layer_are_scaled_and_nothing_else(depth):
    torch.manual_seed(0)
    model = TVMKA(config(ka_layers=depth, ka_init="dt_fixup"))
    ka = model.ka
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    factor = apply_dt_fixup(ka.encoder.layers, mu=7.0)
    assert factor == pytest.approx(depth**-0.5 / 14.0)
    scaled = (".attn.value.weight", ".attn.output.weight", ".ffn_in.weight", ".ffn_out.weight")
    for name, p in model.named_parameters():
        if name.startswith("ka.encoder.") and name.endswith(scaled) and ".shared." not in name:
            assert torch.allclose(p, before[name] * factor), name
        else:  # Q, K, biases, the TVM, and the shared heads (the TVM's weights) stay as they were
            assert torch.equal(p, before[name]), name


def test_dt_fixup_ka_has_no_layer_norm_xavier_init_and_deeper_layers_without_shared_heads():
    torch.manual_seed(0)
    model = TVMKA(config(ka_layers=5, ka_init="dt_fixup"))
    layers = model.ka.encoder.layers
    assert len(layers) == 5 and len(model.tvm.encoder.layers) == 2
    assert all(isinstance(layer.attn_norm, nn.Identity) and isinstance(layer.ffn_norm, nn.Identity) for layer in layers)
    assert all(isinstance(layer.attn_norm, nn.LayerNorm) for layer in model.tvm.encoder.layers)
    assert layers[0].attn.shared is model.tvm.encoder.layers[0].attn.shared  # shared heads still shared
    assert layers[3].attn.shared is None and layers[3].attn.query.out_features == 32  # all 4 heads private
    w = layers[4].ffn_in.weight  # Xavier uniform: bound sqrt(6 / (fan_in + fan_out))
    assert w.abs().max() <= math.sqrt(6 / (32 + 64)) and w.std() > 0.5 * math.sqrt(2 / (32 + 64))
    default = TVMKA(config())
    assert isinstance(default.ka.encoder.layers[0].attn_norm, nn.LayerNorm) and len(default.ka.encoder.layers) == 2


def test_mu_is_the_largest_input_norm_of_the_training_data_and_applies_once():
    torch.manual_seed(0)
    model = TVMKA(config(ka_layers=3, ka_init="dt_fixup"))
    ka = model.ka
    kr = torch.randn(10, 4, 32) * 3
    mask = torch.ones(10, 4, dtype=torch.bool)
    mask[0, 2:] = False
    ka.fit_kr_standardisation(kr[mask])
    with torch.no_grad():
        x, m = ka.inputs(kr, mask)
    expected = float(x.norm(dim=-1)[m].max())
    assert input_norm_bound([(x, m)]) == pytest.approx(expected)
    w = ka.encoder.layers[2].ffn_out.weight.detach().clone()
    mu = fixup_key_aggregator(ka, [(kr[:5], mask[:5]), (kr[5:], mask[5:])])
    assert mu == pytest.approx(expected, rel=1e-5) and float(ka.fixup_mu) == pytest.approx(mu)
    assert torch.allclose(ka.encoder.layers[2].ffn_out.weight, w * dt_fixup_factor(mu, 3))
    fixup_key_aggregator(ka, [(kr, mask)])  # already applied (e.g. a resumed run): nothing changes
    assert torch.allclose(ka.encoder.layers[2].ffn_out.weight, w * dt_fixup_factor(mu, 3))
    with pytest.raises(ValueError, match="ka_init"):
        TVMKA(config(ka_init="fixup"))
