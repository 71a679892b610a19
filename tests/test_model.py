"""The TVM-KA model core: head sharing, DropHead, set semantics of the KA, backends, persistence."""

import pytest
import torch

from seqenc.attention import additive_mask
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA, pool_windows


def tiny_config(**overrides) -> TVMKAConfig:
    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_shared_heads=2, d_ff=64,
                max_positions=32, dropout=0.0, attn_dropout=0.0)
    return TVMKAConfig(**{**base, **overrides})


def batch(B=3, L=12, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, vocab, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 7:] = False  # a padded row
    ids[~mask] = 0
    return ids, mask


def test_shared_heads_are_the_same_parameters():
    model = TVMKA(tiny_config())
    for tvm_layer, ka_layer in zip(model.tvm.encoder.layers, model.ka.encoder.layers):
        assert tvm_layer.attn.shared is ka_layer.attn.shared
        assert tvm_layer.attn.shared.query.weight.data_ptr() == ka_layer.attn.shared.query.weight.data_ptr()
        # private heads and W^O are separate objects with separate storage
        assert tvm_layer.attn.query.weight.data_ptr() != ka_layer.attn.query.weight.data_ptr()
        assert tvm_layer.attn.output.weight.data_ptr() != ka_layer.attn.output.weight.data_ptr()
        # 2 shared + 2 private heads of d_head 8 each
        assert tvm_layer.attn.shared.query.weight.shape == (16, 32)
        assert tvm_layer.attn.query.weight.shape == (16, 32)
    n_shared = sum(p.numel() for p in model.shared_parameters())
    assert n_shared == 2 * 3 * (16 * 32 + 16)  # layers x (q, k, v) x (weight + bias)


def test_ka_loss_reaches_shared_heads_but_not_tvm_private_heads():
    model = TVMKA(tiny_config())
    kr = torch.randn(2, 5, 32)
    loss = model.ka(kr, torch.ones(2, 5, dtype=torch.bool)).sum()
    loss.backward()
    for p in model.shared_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0
    for name, p in model.tvm.named_parameters():
        if ".attn.shared." not in name:
            assert p.grad is None, name


def test_ka_is_invariant_to_key_order():
    model = TVMKA(tiny_config()).eval()
    kr = torch.randn(2, 7, 32)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    out = model.ka(kr, mask)
    for seed in range(3):
        perm = torch.randperm(5, generator=torch.Generator().manual_seed(seed))
        shuffled = kr.clone()
        shuffled[:, :5] = kr[:, perm]
        torch.testing.assert_close(model.ka(shuffled, mask), out, atol=1e-5, rtol=0)


def test_padding_does_not_change_real_positions():
    model = TVMKA(tiny_config()).eval()
    ids, mask = batch()
    full = model.tvm(ids, mask)
    short = model.tvm(ids[:1, :7], mask[:1, :7])
    torch.testing.assert_close(full[0, :7], short[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("training", [False, True])
def test_eager_and_sdpa_agree(training):
    torch.manual_seed(0)
    eager = TVMKA(tiny_config(attn_backend="eager", drophead=0.0))
    sdpa = TVMKA(tiny_config(attn_backend="sdpa", drophead=0.0))
    sdpa.load_state_dict(eager.state_dict())
    eager.train(training)
    sdpa.train(training)
    ids, mask = batch()
    torch.testing.assert_close(eager.tvm(ids, mask), sdpa.tvm(ids, mask), atol=1e-5, rtol=0)
    kr, km = torch.randn(2, 6, 32), torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6], dtype=torch.bool)
    torch.testing.assert_close(eager.ka(kr, km), sdpa.ka(kr, km), atol=1e-5, rtol=0)


def test_drophead_only_in_training_only_on_shared_heads_at_rate():
    rate = 0.2
    model = TVMKA(tiny_config(drophead=rate))
    attn = model.tvm.encoder.layers[0].attn
    assert model.ka.encoder.layers[0].attn.drophead == 0.0  # KA never drops heads
    model.eval()
    assert attn.drophead_scale(8, "cpu", torch.float32) is None
    model.train()
    torch.manual_seed(0)
    scale = attn.drophead_scale(20000, "cpu", torch.float32)[:, :, 0, 0]  # [B, h]
    shared, private = scale[:, :2], scale[:, 2:]
    assert torch.all(private == 1.0)
    dropped = (shared == 0).float().mean().item()
    assert abs(dropped - rate) < 0.01  # 40000 Bernoulli draws: std ~0.002
    kept = shared[shared != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - rate)))
    assert abs(shared.mean().item() - 1.0) < 0.02  # expectation preserved


def test_drophead_changes_tvm_training_outputs_only():
    model = TVMKA(tiny_config(drophead=0.5))
    ids, mask = batch()
    model.train()
    torch.manual_seed(1)
    a = model.tvm(ids, mask)
    torch.manual_seed(2)
    b = model.tvm(ids, mask)
    assert not torch.allclose(a, b)  # dropout is 0: only DropHead makes training stochastic
    model.eval()
    torch.testing.assert_close(model.tvm(ids, mask), model.tvm(ids, mask))


def test_no_shared_heads():
    model = TVMKA(tiny_config(n_shared_heads=0))
    assert model.shared_parameters() == []
    ids, mask = batch()
    assert model.tvm(ids, mask).shape == (3, 12, 32)


@pytest.mark.parametrize("positions", ["sequence", "within_value"])
def test_save_load_round_trip(tmp_path, positions):
    model = TVMKA(tiny_config(tvm_positions=positions, val_sep_token_id=5)).eval()
    model.save_pretrained(tmp_path, extra={"threshold": 0.3})
    loaded = TVMKA.from_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    assert loaded.tvm.encoder.layers[1].attn.shared is loaded.ka.encoder.layers[1].attn.shared
    ids, mask = batch()
    torch.testing.assert_close(loaded.tvm(ids, mask), model.tvm(ids, mask), atol=0, rtol=0)
    kr = torch.randn(2, 4, 32)
    km = torch.ones(2, 4, dtype=torch.bool)
    torch.testing.assert_close(loaded.ka(kr, km), model.ka(kr, km), atol=0, rtol=0)


def test_mask_conversion_and_pooling():
    mask = torch.tensor([[True, True, False]])
    bias = additive_mask(mask, torch.float32)
    assert bias.shape == (1, 1, 1, 3)
    assert bias[0, 0, 0, 0] == 0 and bias[0, 0, 0, 2] < -1e30
    with pytest.raises(TypeError):
        additive_mask(mask.long(), torch.float32)
    vectors = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    pooled = pool_windows(vectors, torch.tensor([0, 0, 1]), 2)
    torch.testing.assert_close(pooled, torch.tensor([[2.0, 1.0], [5.0, 5.0]]))


def test_config_validation():
    with pytest.raises(ValueError):
        tiny_config(n_shared_heads=5)
    with pytest.raises(ValueError):
        tiny_config(d_model=30)
    with pytest.raises(ValueError):
        TVMKAConfig.from_dict({"d_model": 32, "n_heads": 4, "bogus": 1})


def _s_of_k(values: list[list[int]], cls=2, key=(9,), val_sep=5) -> torch.Tensor:
    """[1, L] ids of S(k) = [CLS] k [VAL_SEP] v1 [VAL_SEP] v2 ..."""
    ids = [cls, *key]
    for v in values:
        ids += [val_sep, *v]
    return torch.tensor([ids])


@pytest.mark.parametrize("positions", ["sequence", "within_value"])
def test_tvm_positions_decide_whether_kr_reads_the_order_of_values(positions):
    model = TVMKA(tiny_config(tvm_positions=positions, val_sep_token_id=5)).eval()
    values = [[11, 12], [13], [14, 15, 16], [11, 12]]
    reordered = [values[2], values[0], values[3], values[1]]
    inner = [[12, 11], [13], [14, 15, 16], [11, 12]]  # one value's own tokens swapped
    kr = {name: model.tvm.key_representations(ids, torch.ones_like(ids, dtype=torch.bool))
          for name, ids in (("as is", _s_of_k(values)), ("reordered", _s_of_k(reordered)),
                            ("inner", _s_of_k(inner)))}
    # a value's own token order counts under both schemes
    assert not torch.allclose(kr["as is"], kr["inner"], atol=1e-4)
    if positions == "within_value":  # a bag of values: the same values in another order, the same KR(k)
        torch.testing.assert_close(kr["reordered"], kr["as is"], atol=1e-5, rtol=0)
    else:  # the paper: KR(k) depends on when each value came
        assert not torch.allclose(kr["reordered"], kr["as is"], atol=1e-4)


def test_within_value_positions_need_the_val_sep_id():
    with pytest.raises(ValueError, match="val_sep_token_id"):
        tiny_config(tvm_positions="within_value")
    with pytest.raises(ValueError, match="tvm_positions"):
        tiny_config(tvm_positions="bag", val_sep_token_id=5)
