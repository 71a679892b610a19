"""Algorithm 1 on a small learnable problem: the phases do what the paper says, and it learns."""

import math

import numpy as np
import polars as pl
import pytest
import torch
from toy_tokens import tokenized

from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA
from seqenc.sequences import collect_value_sequences
from seqenc.tokenizer import ValueTokenizer
from training.engine.trainer import InterleavedTrainer, TrainConfig
from training.tasks.data import class_weights, mask_tokens, split_indices


def toy_objects(n=160, seed=0):
    """Sequences of status and latency values; positives keep failing from step 2 on (same keys and lengths)."""
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for i in range(n):
        positive = i % 4 == 0
        for step in range(int(rng.integers(4, 9))):
            status = "failed" if positive and step >= 2 else rng.choice(["ok", "done"])
            rows += [(f"s{i}", step, "status", str(status)),
                     (f"s{i}", step, "latency", str(int(rng.integers(10, 90))))]
        labels.append(int(positive))
    df = pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row")
    return df, np.array(labels)


def build(seed=0, **train_overrides):
    objects, labels = toy_objects(seed=seed)
    tok, data, y = tokenized(collect_value_sequences(objects), labels)  # labels in the data's sequence order
    torch.manual_seed(seed)
    config = TVMKAConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=4, n_shared_heads=2,
                         d_ff=64, max_positions=32, dropout=0.0, attn_dropout=0.0, task="binary", n_classes=2)
    cfg = TrainConfig(**{"pretrain_steps": 20, "rounds": 3, "tvm_steps_per_round": 20, "batch_tokens": 1024,
                         "ka_batch_size": 16, "lr_ka": 2e-3, "warmup_steps": 5, "seed": seed,
                         **train_overrides})
    return TVMKA(config), tok, data, y, split_indices(y, seed), cfg


def test_interleaved_training_learns_and_logs(tmp_path):
    model, tok, data, y, splits, cfg = build()
    logged = []
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path,
                                 log_metrics=lambda m, s: logged.append((s, m)), progress=False)
    result = trainer.fit()
    assert result["test"]["f1"] >= 0.9, result["test"]
    assert cfg.ka_steps_per_round == 10  # 2:1 TVM:KA by default
    assert len(trainer.history["train/mlm_loss"]) == 20 + 3 * 20
    assert len(trainer.history["train/task_loss"]) == 3 * 10
    assert trainer.step == 20 + 3 * 20 + 3 * 10
    rounds = [m["round"] for _, m in logged if "round" in m]
    assert rounds == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.glob("kr_cache_v*.safetensors")) == [
        f"kr_cache_v{r}.safetensors" for r in (1, 2, 3, 4)]
    mlm = [v for _, v in trainer.history["train/mlm_loss"]]
    assert np.mean(mlm[-10:]) < np.mean(mlm[:10])  # the TVM's masked-LM loss goes down


def test_ka_phase_moves_shared_heads_and_nothing_else_of_the_tvm(tmp_path):
    model, tok, data, y, splits, cfg = build()
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False)
    trainer.refresh_cache(0)
    kr = trainer.kr
    before = {n: p.detach().clone() for n, p in model.tvm.named_parameters()}
    trainer.ka_steps(3, 1)
    for name, p in model.tvm.named_parameters():
        changed = not torch.equal(before[name], p)
        assert changed == (".attn.shared." in name), name
    # the refreshed KRs now differ: the KA's steps changed how the TVM encodes S(k)
    trainer.refresh_cache(1)
    assert not torch.allclose(trainer.kr, kr)


def test_mask_tokens_follows_bert_recipe():
    tok = ValueTokenizer.train([f"w{i}" for i in range(300)], vocab_size=400, min_frequency=1)
    ids = torch.randint(len(tok.special_ids), tok.vocab_size, (200, 50))
    ids[:, 0] = tok.cls_id
    ids[:, 10] = tok.val_sep_id
    masked, labels = mask_tokens(ids, tok, torch.Generator().manual_seed(0))
    picked = labels != -100
    assert not picked[:, 0].any() and not picked[:, 10].any()  # special tokens are never picked
    assert abs(picked.float().mean().item() - 0.15 * 48 / 50) < 0.01
    became_mask = (masked[picked] == tok.mask_id).float().mean().item()
    unchanged = (masked[picked] == ids[picked]).float().mean().item()
    assert abs(became_mask - 0.8) < 0.03 and abs(unchanged - 0.1) < 0.03
    assert torch.equal(labels[picked], ids[picked])
    assert torch.equal(masked[~picked], ids[~picked])


def test_mask_values_picks_whole_values():
    """unit="value": a value's tokens are picked together and treated alike, the key never."""
    tok = ValueTokenizer.train([f"w{i}" for i in range(300)], vocab_size=400, min_frequency=1)
    n_rows, key_len, n_values, value_len = 400, 3, 8, 4
    ids = torch.randint(len(tok.special_ids), tok.vocab_size, (n_rows, 1 + key_len + n_values * (1 + value_len)))
    ids[:, 0] = tok.cls_id
    seps = [1 + key_len + i * (1 + value_len) for i in range(n_values)]
    ids[:, seps] = tok.val_sep_id
    masked, labels = mask_tokens(ids, tok, torch.Generator().manual_seed(0), unit="value")
    picked = labels != -100
    assert not picked[:, :1 + key_len].any() and not picked[:, seps].any()
    spans = torch.stack([picked[:, s + 1:s + 1 + value_len] for s in seps], 1)  # [rows, values, tokens]
    assert torch.equal(spans.all(-1), spans.any(-1))  # all of a value's tokens or none
    value_picked = spans[..., 0]
    assert abs(value_picked.float().mean().item() - 0.15) < 0.02
    outcome = torch.stack([masked[:, s + 1:s + 1 + value_len] for s in seps], 1)[value_picked]  # [picked, tokens]
    original = torch.stack([ids[:, s + 1:s + 1 + value_len] for s in seps], 1)[value_picked]
    all_masked = (outcome == tok.mask_id).all(-1)
    all_kept = (outcome == original).all(-1)
    assert abs(all_masked.float().mean().item() - 0.8) < 0.05 and abs(all_kept.float().mean().item() - 0.1) < 0.04
    assert not ((outcome == tok.mask_id).any(-1) & ~all_masked).any()  # never a half-masked value
    assert torch.equal(masked[~picked], ids[~picked])
    with pytest.raises(ValueError, match="mask unit"):
        mask_tokens(ids, tok, torch.Generator(), unit="word")
    with pytest.raises(ValueError, match="mlm_mask_unit"):
        TrainConfig(mlm_mask_unit="span")


def test_splits_and_class_weights():
    y = np.array([0] * 80 + [1] * 20)
    s1, s2 = split_indices(y, 3), split_indices(y, 3)
    assert all(np.array_equal(s1[k], s2[k]) for k in s1)  # deterministic
    assert sorted(np.concatenate(list(s1.values())).tolist()) == list(range(100))  # a partition
    assert [int(y[s1[k]].sum()) for k in ("train", "dev", "test")] == [12, 4, 4]  # stratified
    w = class_weights(y, 2)
    assert w[1] / w[0] == 4.0


def test_no_interleave_trains_the_tvm_once_then_only_the_ka(tmp_path):
    model, tok, data, y, splits, cfg = build(mode="no_interleave", rounds=2, tvm_steps_per_round=10,
                                             pretrain_steps=10)
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False)
    trainer.fit()
    mlm_steps = [s for s, _ in trainer.history["train/mlm_loss"]]
    task_steps = [s for s, _ in trainer.history["train/task_loss"]]
    assert len(mlm_steps) == 10 + 2 * 10 and len(task_steps) == 2 * 5
    assert max(mlm_steps) < min(task_steps)  # every TVM step comes first
    assert sorted(p.name for p in tmp_path.glob("kr_cache_v*")) == ["kr_cache_v1.safetensors",
                                                                     "kr_cache_v3.safetensors"]


class Killed(Exception):
    pass


def test_resume_from_a_checkpoint_continues_exactly(tmp_path):
    """Interrupt mid-round (after the last checkpoint, so work is redone), resume in a fresh
    trainer with a freshly initialised model: the same history, final weights and metrics as an
    uninterrupted run."""
    overrides = {"rounds": 2, "tvm_steps_per_round": 8, "pretrain_steps": 6, "checkpoint_every": 5,
                 "eval_every": 2, "log_every": 1}
    model, tok, data, y, splits, cfg = build(**overrides)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}  # its initial weights
    straight = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path / "a", progress=False)
    expected = straight.fit()

    def kill_at(step):
        def log(metrics, s):
            if s == step:
                raise Killed
        return log

    torch.manual_seed(1)
    first = InterleavedTrainer(TVMKA(model.config), tok, data, y, splits, cfg, tmp_path / "b",
                               log_metrics=kill_at(17), progress=False)
    first.model.load_state_dict(fresh)
    with pytest.raises(Killed):
        first.fit()
    # step 17 is in round 1's KA phase (6 pretrain + 8 TVM + 4 KA = 18); steps 16-17 are lost
    assert first.checkpoints.latest().name == "step-000000015"
    torch.manual_seed(2)
    again = TVMKA(model.config)
    resumed = InterleavedTrainer(again, tok, data, y, splits, cfg, tmp_path / "b", progress=False)
    assert resumed.resume() and (resumed.step, resumed.phase) == (15, 3)
    result = resumed.fit()
    assert resumed.history == straight.history
    for name, p in model.state_dict().items():
        assert torch.equal(p, again.state_dict()[name]), name
    assert result["dev"] == expected["dev"] and result["test"] == expected["test"]


def test_pretraining_length_in_epochs_and_gradient_accumulation(tmp_path):
    model, tok, data, y, splits, cfg = build(pretrain_epochs=1.5, rounds=1, tvm_steps_per_round=2, grad_accum=2)
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False)
    per_epoch = trainer.mlm.batches_per_epoch
    assert trainer.plan[0] == ("tvm", 0, math.ceil(1.5 * per_epoch))
    trainer.fit()
    # two micro-batches per update: every MLM batch of 1.5 epochs (+ round 1) was drawn
    mlm_updates = len(trainer.history["train/mlm_loss"])
    assert mlm_updates == math.ceil(1.5 * per_epoch) + 2
    drawn = 2 * mlm_updates
    assert len(trainer.mlm._order) == (-drawn) % per_epoch


def test_mlm_on_normal_sequences_reads_only_normal_train_windows(tmp_path, caplog):
    model, tok, data, y, splits, cfg = build(mlm_sequences="normal")
    model.config.surprise_scoring = True
    with caplog.at_level("WARNING", logger="training.engine.trainer"):
        trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False)
        assert not caplog.records  # the pairing surprise scoring wants
        InterleavedTrainer(model, tok, data, y, splits, TrainConfig(**{**cfg.__dict__, "mlm_sequences": "all"}),
                           tmp_path / "all", progress=False)
    assert "mlm_sequences='normal'" in caplog.text  # surprise on a masked LM that read the anomalies too
    normal = splits["train"][y[splits["train"]] == 0]
    assert 0 < len(normal) < len(splits["train"])
    expected = sorted(map(tuple, data.subset(normal).windows))
    assert sorted(map(tuple, trainer.mlm.windows)) == expected
    # a positive train sequence's windows are never read by the masked LM
    positive = data.subset(splits["train"][y[splits["train"]] == 1]).windows
    assert not set(map(tuple, positive)) & set(expected)
    # the KA still trains on every train sequence, positives included
    trainer.refresh_cache(0)
    trainer.ka_steps(2, 1)
    assert len(trainer.history["train/task_loss"]) == 2
    with pytest.raises(ValueError, match="mlm_sequences"):
        TrainConfig(mlm_sequences="anomalous")
    multiclass = TVMKAConfig(**{**model.config.__dict__, "task": "multiclass", "n_classes": 3, "surprise_scoring": False})
    with pytest.raises(ValueError, match="binary task"):
        InterleavedTrainer(TVMKA(multiclass), tok, data, y, splits, cfg, tmp_path / "mc", progress=False)


def test_dt_fixup_ka_is_scaled_once_at_the_first_refresh_and_learns_without_warm_up(tmp_path):
    model, tok, data, y, splits, cfg = build()
    config = TVMKAConfig(**{**model.config.to_dict(), "ka_layers": 4, "ka_init": "dt_fixup"})
    torch.manual_seed(0)
    model = TVMKA(config)
    logged = []
    trainer = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path,
                                 log_metrics=lambda m, s: logged.append((s, m)), progress=False)
    assert trainer.engines["ka"].scheduler.get_last_lr()[0] == pytest.approx(cfg.lr_ka)  # no warm-up
    assert float(model.ka.fixup_mu) == 0
    result = trainer.fit()
    mus = [m["ka/fixup_mu"] for _, m in logged if "ka/fixup_mu" in m]
    assert len(mus) == 1 and mus[0] == pytest.approx(float(model.ka.fixup_mu)) and mus[0] > 1  # once, measured
    assert len(model.ka.encoder.layers) == 4 and result["test"]["f1"] >= 0.9, result["test"]


def test_an_ema_ka_trains_in_the_interleaved_trainer(tmp_path):
    model, tok, data, y, splits, cfg = build(tvm_ka_ratio=0.5)
    torch.manual_seed(0)
    model = TVMKA(TVMKAConfig(**{**model.config.to_dict(), "ka_mixer": "ema", "mafid_reduction": 2}))
    result = InterleavedTrainer(model, tok, data, y, splits, cfg, tmp_path, progress=False).fit()
    assert result["test"]["f1"] >= 0.9, result["test"]
