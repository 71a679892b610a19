"""The classifier's bag of values (TVMKAConfig.value_counts): hashing, the wide head, training."""

import numpy as np
import polars as pl
import pytest
import torch
from toy_tokens import tokenized

from seqenc.config import TVMKAConfig
from seqenc.heads import WIDE_WEIGHT_SCALE
from seqenc.model import TVMKA
from seqenc.sequences import TokenizedSequences, collect_value_sequences
from training.engine.trainer import InterleavedTrainer, TrainConfig
from training.tasks.data import split_indices

VAL_SEP = 5


def two_sequences() -> TokenizedSequences:
    # s0: key a holds values (10) (10) (11 12), key b holds (10); s1: key a holds (10) and (13),
    # in two windows of S(a). Token 2 is [CLS], 7 and 8 the keys' own tokens.
    return TokenizedSequences(
        ["s0", "s1"], ["a", "b", "a"], np.array([0, 0, 1]),
        [[2, 7, 5, 10, 5, 10, 5, 11, 12], [2, 8, 5, 10], [2, 7, 5, 10], [2, 7, 5, 13]],
        np.array([0, 1, 2, 2]))


def as_dicts(bags) -> list[dict[int, float]]:
    buckets, offsets, weights = bags
    ends = [*offsets[1:].tolist(), len(buckets)]
    return [dict(zip(buckets[a:b].tolist(), weights[a:b].tolist())) for a, b in zip(offsets.tolist(), ends)]


def test_value_count_bags_count_every_keyed_value_of_every_window():
    data = two_sequences()
    s0, s1 = as_dicts(data.value_count_bags(np.array([0, 1]), 1 << 20, VAL_SEP))
    assert sorted(s0.values()) == pytest.approx(sorted([np.log(3), np.log(2), np.log(2)]))  # a=10 twice
    assert sorted(s1.values()) == pytest.approx([np.log(2), np.log(2)])  # both windows of S(a) count
    a10 = next(b for b, w in s0.items() if w == pytest.approx(np.log(3)))
    assert a10 in s1 and len(set(s0) | set(s1)) == 4  # a=10 hashes alike everywhere; b=10 is another pair
    assert a10 == 870788  # CRC-32 of the key and the token ids: the same bucket on every run and machine
    # a sequence's bag is its own whatever the batch or the subset
    (only_s1,) = as_dicts(data.value_count_bags(np.array([1]), 1 << 20, VAL_SEP))
    assert only_s1 == s1
    assert as_dicts(data.subset(np.array([1, 0])).value_count_bags(np.array([0, 1]), 1 << 20, VAL_SEP)) == [s1, s0]
    # colliding buckets add their counts: in one bucket, s0's 4 values weigh log(1 + 4)
    assert as_dicts(data.value_count_bags(np.array([0]), 1, VAL_SEP)) == [{0: pytest.approx(np.log(5))}]


def tiny_config(**overrides) -> TVMKAConfig:
    return TVMKAConfig(**{"vocab_size": 50, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_shared_heads": 1,
                          "d_ff": 32, "max_positions": 16, "task": "multiclass", "n_classes": 3,
                          "value_counts": 64, "val_sep_token_id": VAL_SEP, **overrides})


def test_the_wide_head_adds_a_linear_model_of_the_bag_to_the_kas_logits(tmp_path):
    model = TVMKA(tiny_config()).eval()
    plain = TVMKA(tiny_config(value_counts=0)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if ".wide." not in k})
    data = two_sequences()
    reprs, mask = torch.randn(2, 2, 16), torch.ones(2, 2, dtype=torch.bool)
    bags = model.ka.head_input(data, np.array([0, 1]))
    with torch.no_grad():
        assert torch.equal(model.ka(reprs, mask, bags), plain.ka(reprs, mask))  # the wide part starts at zero
        model.ka.head.wide.weight.normal_()
        shift = model.ka(reprs, mask, bags) - plain.ka(reprs, mask)
    buckets, offsets, weights = bags
    w = model.ka.head.wide.weight.detach()
    expected = torch.stack([(w[buckets[a:b]] * weights[a:b, None]).sum(0) for a, b in ((0, offsets[1]),
                                                                                        (offsets[1], len(buckets)))])
    assert torch.allclose(shift, expected * WIDE_WEIGHT_SCALE, atol=1e-5)
    model.ka(reprs, mask, bags).sum().backward()
    assert model.ka.head.wide.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="bag of values"):
        model.ka(reprs, mask)
    model.save_pretrained(tmp_path / "m")  # the setting and the wide weights survive a save
    back = TVMKA.from_pretrained(tmp_path / "m")
    assert back.config.value_counts == 64 and torch.equal(back.ka.head.wide.weight, model.ka.head.wide.weight)
    with pytest.raises(ValueError, match="classification tasks"):
        tiny_config(task="next_item", n_items=4)
    with pytest.raises(ValueError, match="val_sep_token_id"):
        tiny_config(val_sep_token_id=None)
    with pytest.raises(ValueError, match=">= 0"):
        tiny_config(value_counts=-1)


def majority_objects(n=240, seed=0):
    """Class c: the value v<c> occurs 3-4 times among 4 random ones of key ``kind``; ``qty`` is noise."""
    rng = np.random.default_rng(seed)
    rows, y = [], []
    for i in range(n):
        c = int(rng.integers(4))
        values = [f"v{c}"] * int(rng.integers(3, 5)) + [f"v{int(rng.integers(4))}" for _ in range(4)]
        for step, v in enumerate(rng.permutation(values)):
            rows += [(f"s{i}", step, "kind", v), (f"s{i}", step, "qty", str(int(rng.integers(1, 4))))]
        y.append(c)
    return pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row"), np.array(y)


def test_the_bag_of_values_helps_a_small_model_learn_a_count_decided_task(tmp_path):
    objects, labels = majority_objects()
    tok, data, y = tokenized(collect_value_sequences(objects), labels)
    f1 = {}
    for buckets in (0, 64):
        torch.manual_seed(0)
        config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2,
                             d_ff=64, max_positions=32, dropout=0.0, attn_dropout=0.0, task="multiclass", n_classes=4,
                             value_counts=buckets, val_sep_token_id=tok.val_sep_id)
        cfg = TrainConfig(pretrain_steps=5, rounds=2, tvm_steps_per_round=3, tvm_ka_ratio=0.2, batch_tokens=2048,
                          ka_batch_size=16, lr_ka=1e-3, warmup_steps=2, seed=0)
        trainer = InterleavedTrainer(TVMKA(config), tok, data, y, split_indices(y, 0), cfg, tmp_path / str(buckets),
                                     progress=False)
        f1[buckets] = trainer.fit()["test"]["macro_f1"]
    assert f1[64] >= 0.9 and f1[64] > f1[0], f1
