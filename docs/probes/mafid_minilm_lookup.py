"""Probe (2026-11-27, docs/tables.md "MiniLM-initialised MAFiD on lookup"): MAFiD's ablations from
MiniLM on the 4-row lookup task, run on a GPU machine that has PyTorch but neither polars nor
mlflow, so outside the pipeline. It uses the product's model classes, MiniLM init, row blocks,
engine and class weights, and the pipeline's examples and split. Those were written on the CPU
machine from a `seqenc bench tables` workdir of lookup4 into .devdata/ (lookup4.json: ids, tables
as (text, header, rows), labels, split; configs.json: each variant's TVMKAConfig as the bench
builds it; minilm/: the bundled MiniLM with its weights in fp16). Run per variant:

    PYTHONPATH=. python3 docs/probes/mafid_minilm_lookup.py mafid_no_ema_minilm 2000 OUT.json 380
"""
import json
import sys
import time
import types

sys.modules.setdefault("polars", types.ModuleType("polars"))  # imported by seqenc.table_inputs, unused here
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from seqenc.config import TVMKAConfig  # noqa: E402
from seqenc.mafid import pad_row_blocks, row_blocks  # noqa: E402
from seqenc.pretrained import load_bert_table_encoder  # noqa: E402
from seqenc.table_model import table_encoder  # noqa: E402
from seqenc.tokenizer import ValueTokenizer  # noqa: E402
from training.engine.engines import PlainEngine  # noqa: E402

variant, steps, out, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
eval_limit = int(sys.argv[5]) if len(sys.argv) > 5 else None  # a smoke run on CPU only
t0 = time.time()
torch.manual_seed(0)
d = json.load(open(".devdata/lookup4.json"))
cfg = TVMKAConfig.from_dict(json.load(open(".devdata/configs.json"))[variant])
device = "cuda" if torch.cuda.is_available() else "cpu"
tok = ValueTokenizer.from_bert(".devdata/minilm")
model = table_encoder(cfg)
load_bert_table_encoder(model, ".devdata/minilm")
model.to(device)
y = np.array(d["y"])
split = np.array(d["split"])
parts = {p: np.flatnonzero(split == p) for p in ("train", "dev", "test")}
parts = {p: (v[:eval_limit] if p != "train" else v) for p, v in parts.items()}
cache = {}


def inputs(index):
    for i in index:  # each example's row blocks once (an epoch revisits them)
        if i not in cache:
            cache[i] = row_blocks(tok, *d["tables"][i], cfg)
    return tuple(t.to(device) for t in pad_row_blocks([cache[i] for i in index], tok.pad_id))


def accuracy(part):
    model.eval()
    right = 0
    with torch.no_grad():
        for k in range(0, len(parts[part]), 64):
            idx = parts[part][k:k + 64].tolist()
            right += int((model(*inputs(idx)).argmax(1).cpu().numpy() == y[idx]).sum())
    model.train()
    return right / len(parts[part])


counts = np.bincount(y[parts["train"]], minlength=2).astype(float)
w = counts.sum() / counts / 2
weights = torch.tensor(w / w.mean(), dtype=torch.float32, device=device)
engine = PlainEngine(model, 1e-4, 0.01, 50, steps, 1.0)
rng = np.random.default_rng(0)
losses, done = [], 0
model.train()
for step in range(steps):
    if time.time() - t0 > budget:
        break
    batch = rng.choice(parts["train"], size=16, replace=False).tolist()
    loss = F.cross_entropy(model(*inputs(batch)), torch.as_tensor(y[batch], device=device), weight=weights)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    done = step + 1
    if done % 500 == 0:
        print(variant, done, round(float(np.mean(losses[-50:])), 4), round(time.time() - t0), flush=True)
r = {"variant": variant, "updates": done, "planned_updates": steps, "dev_accuracy": accuracy("dev"),
     "test_accuracy": accuracy("test"), "loss_every_20": [float(np.mean(losses[k:k + 20])) for k in range(0, len(losses), 20)],
     "seconds": round(time.time() - t0, 1), "device": device}
json.dump(r, open(out, "w"))
print(json.dumps({k: v for k, v in r.items() if k != "loss_every_20"}), flush=True)
