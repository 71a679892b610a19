"""DeepSpeedEngine in one process: trains through the trainer, matches PlainEngine step for step
with the TVM-KA shared heads under ZeRO stages 0, 1 and 2, refuses stage 3, and resumes exactly
from a plain (JSON + tensors) state.

On CPU (CI) that is DeepSpeed's CPU accelerator with gloo. Where CUDA is present the same tests
run on the GPU (NCCL): every model starts on ``DEVICE`` and every batch follows the model, as in
the trainer; the two-rank test stays on CPU unless there is a GPU per rank (``tests/ranks.py``)."""

import copy
import json
import os
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from shared_data import in_ci

from training.engine.deepspeed_engine import import_deepspeed


def _deepspeed_or_skip():
    try:
        import_deepspeed()
    except Exception as exc:  # ImportError, or a broken install failing at import
        if in_ci():
            raise  # CI installs deepspeed: not importing it is a failure there
        pytest.skip(f"deepspeed cannot be imported ({type(exc).__name__}: {exc}); these tests need it",
                    allow_module_level=True)


_deepspeed_or_skip()

from ranks import run_ranks  # noqa: E402  (tests/ranks.py)
from toy_tokens import tokenized  # noqa: E402  (tests/toy_tokens.py)

from seqenc.config import TVMKAConfig  # noqa: E402
from seqenc.inference import to_model  # noqa: E402
from seqenc.model import TVMKA  # noqa: E402
from seqenc.sequences import collect_value_sequences  # noqa: E402
from training.engine.checkpoint import join_tensors, split_tensors  # noqa: E402
from training.engine.deepspeed_engine import DeepSpeedEngine  # noqa: E402
from training.engine.engines import PlainEngine  # noqa: E402
from training.engine.trainer import InterleavedTrainer, TrainConfig  # noqa: E402
from training.tasks.data import split_indices  # noqa: E402

LR, WD, WARMUP, TOTAL, CLIP = 1e-2, 0.01, 2, 10, 0.5
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where DeepSpeed puts a network


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread is fastest, and far faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ds_config(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD, "torch_adam": True}}}


def tiny_model(seed=0) -> TVMKA:
    torch.manual_seed(seed)
    return TVMKA(TVMKAConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=4, n_shared_heads=2, d_ff=32,
                             max_positions=12, dropout=0.0, attn_dropout=0.0, drophead=0.0, task="binary",
                             n_classes=2)).to(DEVICE)


def batches(n=8, seed=0):
    """A schedule of updates: (network, [micro-batches]); some updates accumulate 2 micro-batches."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, net in enumerate(["tvm", "tvm", "ka", "tvm", "ka", "ka", "tvm", "ka"][:n]):
        micro = []
        for _ in range(2 if i % 3 == 1 else 1):
            if net == "tvm":
                ids = torch.randint(5, 40, (3, 12), generator=g)
                mask = torch.ones(3, 12, dtype=torch.bool)
                labels = torch.where(torch.rand(3, 12, generator=g) < 0.3, ids, torch.full_like(ids, -100))
                micro.append((ids, mask, labels))
            else:
                micro.append((torch.randn(4, 5, 16, generator=g), torch.rand(4, 5, generator=g) < 0.8,
                              torch.randint(0, 2, (4,), generator=g)))
        out.append((net, micro))
    return out


def loss_of(model, net, micro, n_micro):
    micro = to_model(micro, getattr(model, net))  # batches are made on the CPU
    if net == "tvm":
        return model.tvm.mlm_loss(*micro) / n_micro
    reprs, mask, y = micro
    mask[:, 0] = True
    return torch.nn.functional.cross_entropy(model.ka(reprs, mask), y) / n_micro


def make_engines(model, stage, clip=CLIP):
    if stage is None:
        return {n: PlainEngine(getattr(model, n), LR, WD, WARMUP, TOTAL, clip) for n in ("tvm", "ka")}
    return {n: DeepSpeedEngine(getattr(model, n), LR, WD, WARMUP, TOTAL, clip, ds_config(stage))
            for n in ("tvm", "ka")}


def run(model, engines, schedule):
    model.train()
    for net, micro in schedule:
        for m in micro:
            engines[net].backward(loss_of(model, net, m, len(micro)))
        engines[net].step()


def plain_roundtrip(state):
    """Through JSON + a tensor table, as training.engine.checkpoint stores it: no pickles, no custom objects."""
    tensors = {}
    skeleton = json.loads(json.dumps(split_tensors(state, tensors, "s")))
    return join_tensors(skeleton, {k: v.clone() for k, v in tensors.items()})


def assert_same_weights(a, b, exact=False):
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        if exact:
            assert torch.equal(p, q), name
        elif "attn.key.bias" not in name and "attn.shared.key.bias" not in name:
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
        # The key biases are left out: their gradient is mathematically zero (softmax is invariant
        # to a constant added to every score), so they only ever see rounding noise, which Adam's
        # normalisation (g / (sqrt(v) + eps)) blows up to ~lr-sized steps. An ulp of difference in
        # the clip coefficient (DeepSpeed sums squared norms, torch takes a norm of norms) or in a
        # matmul over ZeRO's flat buffer (other memory alignment) is enough to move them apart.


@pytest.mark.parametrize("stage,clip", [(0, 1e12), (0, CLIP), (1, CLIP), (2, CLIP)])
def test_matches_plain_engine_with_shared_heads(stage, clip):
    """Interleaved TVM and KA updates (some accumulating two micro-batches) give PlainEngine's
    weights -- bit for bit with stage 0 when clipping does not trigger; the shared heads stay
    single tensors that both networks' updates moved."""
    reference = tiny_model()
    model = copy.deepcopy(reference)  # deepcopy keeps the TVM/KA sharing inside the copy
    schedule = batches()
    run(reference, make_engines(reference, None, clip), schedule)
    before = [p.detach().clone() for p in model.shared_parameters()]
    engines = make_engines(model, stage, clip)
    run(model, engines, schedule)
    assert_same_weights(model, reference, exact=(stage, clip) == (0, 1e12))
    ka_params = dict(model.ka.named_parameters())
    for name, p in model.tvm.named_parameters():
        if ".attn.shared." in name:
            assert p is ka_params[name]
    assert all(not torch.equal(b, p) for b, p in zip(before, model.shared_parameters()))
    # 4 TVM updates: warm-up of 2, then linear decay over the remaining 8 of TOTAL=10
    assert engines["tvm"].scheduler.get_last_lr() == pytest.approx([LR * (1.0 - 0.9 * 2 / 8)])


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_state_dict_round_trip_resumes_exactly(stage):
    schedule = batches()
    straight = tiny_model()
    run(straight, make_engines(straight, stage), schedule)

    first = tiny_model()
    engines = make_engines(first, stage)
    run(first, engines, schedule[:5])
    weights = {k: v.clone() for k, v in first.state_dict().items()}
    states = {n: plain_roundtrip(e.state_dict()) for n, e in engines.items()}
    assert states["tvm"]["scheduler"]["last_epoch"] == 3

    resumed = tiny_model(seed=1)  # other initial weights: everything must come from the state
    engines = make_engines(resumed, stage)
    resumed.load_state_dict(weights)  # as the trainer does: engines first, then the checkpoint
    for n, e in engines.items():
        e.load_state_dict(states[n])
    run(resumed, engines, schedule[5:])
    assert_same_weights(resumed, straight, exact=True)


def test_zero_stage_3_and_bad_configs_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="ZeRO stage 3 is not supported.*share attention heads"):
        DeepSpeedEngine(model.tvm, LR, WD, WARMUP, TOTAL, CLIP, ds_config(3))
    with pytest.raises(ValueError, match="TrainConfig.grad_accum"):
        DeepSpeedEngine(model.tvm, LR, WD, WARMUP, TOTAL, CLIP, {"gradient_accumulation_steps": 4})
    with pytest.raises(ValueError, match="scheduler"):
        DeepSpeedEngine(model.tvm, LR, WD, WARMUP, TOTAL, CLIP, {"scheduler": {"type": "WarmupLR"}})


def test_config_from_a_json_file_defaults_and_fp32_on_cpu(tmp_path):
    """The defaults filled in: clipping, micro-batch, torch's AdamW on every accelerator (no
    FusedAdam to compile); bf16 only where there is a GPU."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 0}, "bf16": {"enabled": True}}))
    model = tiny_model()
    engine = DeepSpeedEngine(model.tvm, LR, WD, WARMUP, TOTAL, CLIP, str(path))
    on_gpu = DEVICE.type == "cuda"
    assert engine.config["bf16"]["enabled"] is on_gpu  # CPU: fp32
    assert engine.config["gradient_clipping"] == CLIP and engine.config["train_micro_batch_size_per_gpu"] == 1
    assert engine.config["optimizer"]["params"] == {"lr": LR, "weight_decay": WD, "torch_adam": True}
    assert isinstance(engine.basic_optimizer, torch.optim.AdamW)
    assert all(p.dtype == (torch.bfloat16 if on_gpu else torch.float32) for p in model.tvm.parameters())
    assert (engine.rank, engine.world_size) == (0, 1)



@pytest.mark.parametrize("stage", [0, 1, 2])
def test_bf16_as_on_a_gpu(monkeypatch, stage):
    """bf16 is only honoured off CPU; pretend (DeepSpeed's CPU accelerator runs bf16): with the
    shared heads it is refused, without sharing the state (fp32 master included) resumes exactly."""
    import training.engine.deepspeed_engine as module

    monkeypatch.setattr(module, "_accelerator_is_cpu", lambda: False)
    cfg = {**ds_config(stage), "bf16": {"enabled": True}}
    shared = tiny_model()
    tvm = DeepSpeedEngine(shared.tvm, LR, WD, WARMUP, TOTAL, CLIP, cfg)  # noqa: F841 (alive: in the registry)
    with pytest.raises(ValueError, match="fp16/bf16 .* share parameters"):
        DeepSpeedEngine(shared.ka, LR, WD, WARMUP, TOTAL, CLIP, cfg)

    def unshared(seed):
        torch.manual_seed(seed)
        model = TVMKA(TVMKAConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=4, n_shared_heads=0, d_ff=32,
                                  max_positions=12, dropout=0.0, attn_dropout=0.0, drophead=0.0))
        return model, {"tvm": DeepSpeedEngine(model.tvm, LR, WD, WARMUP, TOTAL, CLIP, cfg)}

    schedule = [b for b in batches() if b[0] == "tvm"]
    straight, engines = unshared(0)
    run(straight, engines, schedule)
    assert straight.tvm.mlm_bias.dtype == torch.bfloat16
    first, engines = unshared(0)
    run(first, engines, schedule[:2])
    weights, state = first.state_dict(), plain_roundtrip(engines["tvm"].state_dict())
    assert state["master"] and all(t.dtype == torch.float32 for t in state["master"])
    resumed, engines = unshared(1)
    resumed.load_state_dict(weights)
    engines["tvm"].load_state_dict(state)
    run(resumed, engines, schedule[2:])
    assert_same_weights(resumed.tvm, straight.tvm, exact=True)

def toy_task(n=48, seed=0):
    rng = np.random.default_rng(seed)
    rows, labels = [], []
    for i in range(n):
        positive = i % 4 == 0
        for step in range(int(rng.integers(3, 6))):
            status = "failed" if positive and step >= 1 else str(rng.choice(["ok", "done"]))
            rows += [(f"s{i}", step, "status", status), (f"s{i}", step, "latency", str(int(rng.integers(10, 90))))]
        labels.append(int(positive))
    vs = collect_value_sequences(pl.DataFrame(rows, schema=["sequence_id", "step", "key", "value"], orient="row"))
    return tokenized(vs, labels, vocab_size=120, max_len=16)


@pytest.mark.parametrize("stage", [0, 2])
def test_interleaved_trainer_under_deepspeed(tmp_path, stage, caplog):
    tok, data, y = toy_task()
    torch.manual_seed(0)
    model = TVMKA(TVMKAConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=4, n_shared_heads=2,
                              d_ff=32, max_positions=16, dropout=0.0, attn_dropout=0.0, task="binary", n_classes=2))
    shared_before = [p.detach().clone() for p in model.shared_parameters()]
    cfg = TrainConfig(pretrain_steps=3, rounds=2, tvm_steps_per_round=2, grad_accum=2, batch_tokens=256,
                      ka_batch_size=8, warmup_steps=2, deepspeed=ds_config(stage))
    with caplog.at_level("INFO", logger="training.engine.deepspeed_engine"):
        trainer = InterleavedTrainer(model, tok, data, y, split_indices(y, 0), cfg, tmp_path, progress=False)
    assert all(isinstance(e, DeepSpeedEngine) for e in trainer.engines.values())
    # each engine says what it runs (the line a GPU log is read for)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("DeepSpeed engine for")]
    n_shared = sum(p.numel() for p in model.shared_parameters())
    assert said[0].startswith(f"DeepSpeed engine for TemporalValueModeler: ZeRO stage {stage}, fp32, AdamW on ")
    assert said[1].startswith(f"DeepSpeed engine for KeyAggregator: ZeRO stage {stage}, fp32")
    assert said[1].endswith(f"({n_shared} shared with engines made before it)") and "world size 1" in said[1]
    result = trainer.fit()
    losses = [v for key in ("train/mlm_loss", "train/task_loss") for _, v in trainer.history[key]]
    assert len(losses) == 3 + 2 * 2 + 2 * 1 and np.isfinite(losses).all()
    assert 0.0 <= result["test"]["f1"] <= 1.0
    ka = dict(model.ka.named_parameters())
    for name, p in model.tvm.named_parameters():
        if ".attn.shared." in name:
            assert p is ka[name] and p.data_ptr() == ka[name].data_ptr()
    assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(shared_before, model.shared_parameters()))
    assert trainer.checkpoints.latest() is not None  # the engines' states went through the checkpointer



class Killed(Exception):
    pass


def test_trainer_resumes_exactly_under_zero_2(tmp_path):
    """Through the trainer's own checkpoints (safetensors + JSON): interrupted after its last
    checkpoint, resumed by a fresh trainer on a freshly initialised model, the run ends where an
    uninterrupted one does."""
    tok, data, y = toy_task()
    splits = split_indices(y, 0)
    cfg = TrainConfig(pretrain_steps=3, rounds=2, tvm_steps_per_round=2, batch_tokens=256, ka_batch_size=8,
                      warmup_steps=2, checkpoint_every=3, log_every=1, deepspeed=ds_config(2))

    def model(seed):
        torch.manual_seed(seed)
        return TVMKA(TVMKAConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=4, n_shared_heads=2,
                                 d_ff=32, max_positions=16, dropout=0.0, attn_dropout=0.0, task="binary",
                                 n_classes=2))

    straight = InterleavedTrainer(model(0), tok, data, y, splits, cfg, tmp_path / "a", progress=False)
    expected = straight.fit()

    def kill_at_8(metrics, step):
        if step == 8:
            raise Killed

    first = InterleavedTrainer(model(0), tok, data, y, splits, cfg, tmp_path / "b", log_metrics=kill_at_8,
                               progress=False)
    with pytest.raises(Killed):
        first.fit()
    resumed = InterleavedTrainer(model(1), tok, data, y, splits, cfg, tmp_path / "b", progress=False)
    assert resumed.resume() and resumed.step == 6  # steps 7-8 are redone
    result = resumed.fit()
    assert resumed.history == straight.history
    for name, p in straight.model.state_dict().items():
        assert torch.equal(p, resumed.model.state_dict()[name]), name
    assert result["test"] == expected["test"]

# --- data parallel: two processes under torchrun (this file is also the worker script) ----------
def two_rank_worker(stage: int) -> float:
    """Each rank trains on its own batches; DeepSpeed averages the gradients, so the result must
    be PlainEngine's on the mean of the two ranks' losses. Returns the largest difference."""
    rank = int(os.environ["RANK"])
    per_rank = [batches(seed=1), batches(seed=2)]
    reference = tiny_model()
    model = copy.deepcopy(reference)
    engines = make_engines(model, stage)
    assert (engines["tvm"].rank, engines["tvm"].world_size) == (rank, 2)
    run(model, engines, per_rank[rank])
    plain = make_engines(reference, None)
    reference.train()
    for (net, mine), (_, other) in zip(*per_rank):
        for a, b in zip(mine, other):
            plain[net].backward((loss_of(reference, net, a, len(mine)) + loss_of(reference, net, b, len(other))) / 2)
        plain[net].step()
    assert_same_weights(model, reference)
    return max(float((p - q).abs().max()) for p, q in zip(model.state_dict().values(), reference.state_dict().values()))


def test_two_processes_zero_1_and_2_with_shared_heads():
    """ZeRO-1/2 partition the optimizer state (and gradients) across ranks; the shared heads stay
    correct (this is where ZeRO's per-parameter attributes, overwritten by the engine created
    last, would otherwise send gradients to the wrong slots). Two workers started the way a
    launcher starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)."""
    outputs = run_ranks([sys.executable, __file__], Path(__file__).resolve().parents[1], world=2, timeout=300)
    for out in outputs:
        assert out.count("two-rank ok") == 2, out[-4000:]


if __name__ == "__main__":  # a worker of test_two_processes_zero_1_and_2_with_shared_heads
    torch.set_num_threads(1)
    for zero in (1, 2):
        print(f"two-rank ok: stage {zero}, rank {os.environ['RANK']}, max diff {two_rank_worker(zero):.2e}", flush=True)


@pytest.mark.parametrize("stage", [1, 2])
def test_each_deepspeed_internal_the_engine_relies_on_is_there(stage):
    """training/engine/deepspeed_engine.py keeps shared TVM/KA parameters right under ZeRO-1/2 with
    DeepSpeed internals (its docstring, fixes 1-4). Each one is named here, so that a DeepSpeed
    release that renames or drops one fails this test by name, not a training run by accident."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from training.engine.deepspeed_engine import _MASTER_ATTRS, _ZERO_API

    for method in ("refresh_fp32_params", "create_gradient_handling_hooks", "clear_backward_seen_flag"):
        assert callable(getattr(DeepSpeedZeroOptimizer, method, None)), f"DeepSpeedZeroOptimizer.{method}"
    engines = make_engines(tiny_model(), stage)
    zero = engines["tvm"].optimizer
    assert isinstance(zero, DeepSpeedZeroOptimizer)
    for name in _ZERO_API:  # what the engine refuses to start without
        assert hasattr(zero, name), f"DeepSpeedZeroOptimizer().{name}"
    assert isinstance(zero._grad_acc_hooks, list), "DeepSpeedZeroOptimizer()._grad_acc_hooks is a list of handles"
    assert hasattr(zero, _MASTER_ATTRS[0]), f"DeepSpeedZeroOptimizer().{_MASTER_ATTRS[0]} (the fp32 partition)"
    # fix 1: the per-parameter bookkeeping ZeRO keeps on the parameter objects, snapshotted per engine
    shared = {k for p, attrs in engines["ka"]._param_attrs for k in attrs}
    assert {"param_idx_in_group", "_hp_mapping"} <= shared, sorted(shared)
    # the engine's counters (checkpoints) and the hooks released on close
    for name in ("global_steps", "global_samples", "micro_steps", "skipped_steps", "basic_optimizer",
                 "module_forward_pre_hook", "module_forward_post_hook"):
        assert hasattr(engines["tvm"].engine, name), f"DeepSpeedEngine.{name}"


def test_the_shipped_zero_2_config_trains_like_the_plain_engine():
    """docker/ds_zero2.json (the multi-GPU / multi-node example of docker/README.md) builds ZeRO-2
    engines that take the same updates as PlainEngine on the shared-head TVM-KA."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "docker" / "ds_zero2.json"
    schedule = batches()
    reference = tiny_model()
    model = copy.deepcopy(reference)  # keeps the TVM/KA sharing inside the copy
    run(reference, make_engines(reference, None), schedule)
    engines = {n: DeepSpeedEngine(getattr(model, n), LR, WD, WARMUP, TOTAL, CLIP, str(path)) for n in ("tvm", "ka")}
    assert {e.zero_stage for e in engines.values()} == {2}
    run(model, engines, schedule)
    assert_same_weights(model, reference)


def test_an_optimizer_without_lr_takes_the_trainers():
    """A DeepSpeed optimizer section that leaves lr / weight_decay out gets TrainConfig's, not
    DeepSpeed's defaults (which would silently train at another rate); given values win."""
    from training.engine.deepspeed_engine import build_config

    cfg = build_config({"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, 3e-4, 0.05, 1.0, True)
    assert cfg["optimizer"]["params"] == {"torch_adam": True, "lr": 3e-4, "weight_decay": 0.05}
    given = build_config({"optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}}, 3e-4, 0.05, 1.0, True)
    assert given["optimizer"]["params"]["lr"] == 1e-5
