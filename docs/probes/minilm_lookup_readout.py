"""Probe (2026-11-28, docs/tables.md "MiniLM on lookup, CPU"): does a MiniLM-initialised table model
learn the 4-row lookup task on a CPU budget, and is MAFiD's one learned query what keeps MAFiD at
chance? Outside the pipeline (one process per run, one thread each), with the product's model
classes, MiniLM init, row blocks and AdamW engine. Variants: ``dense`` (seqenc.table_model, TAPAS's
flattening) and ``mafid+max`` (MAFiD's row blocks through MiniLM, each row's [CLS] state max-pooled
over the rows into the head: a per-row cross-encoder; single-row attention, EMA and fusion unused).

Split by table (sorted names shuffled by random.Random(0), 60 / 20 / 20); dev and test are scored
on 1,000 seeded samples each, dev every 500 updates, test once at the end. Batch 16, 50 warm-up
steps, no class weights (the labels are balanced). Run from the repository root::

    python docs/probes/minilm_lookup_readout.py LOOKUP4.jsonl LOOKUP4_TABLES/ mafid+max 1500 1e-4 OUT.json
"""
import json
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from seqenc.mafid import pad_row_blocks, row_blocks
from seqenc.pretrained import config_from_bert, load_bert_table_encoder
from seqenc.table_model import TableExamples, table_encoder
from seqenc.tokenizer import ValueTokenizer
from training.engine.engines import PlainEngine

statements, tables_dir, variant, steps, lr, out = sys.argv[1:7]
steps, lr = int(steps), float(lr)
n_eval = int(sys.argv[7]) if len(sys.argv) > 7 else 1000  # fewer: a smoke run
torch.manual_seed(0)
records = [json.loads(line) for line in open(statements) if line.strip()]


def table(name):
    rows = [line.split("#") for line in open(f"{tables_dir}/{name}").read().splitlines() if line.strip()]
    return rows[0], rows[1:]


names = sorted({r["table"] for r in records})
random.Random(0).shuffle(names)
part_of = {t: "train" if i < len(names) * 0.6 else "dev" if i < len(names) * 0.8 else "test" for i, t in enumerate(names)}
examples = TableExamples([str(i) for i in range(len(records))], [(r["statement"], *table(r["table"])) for r in records])
y = np.array([r["label"] for r in records])
split = np.array([part_of[r["table"]] for r in records])
parts = {p: np.flatnonzero(split == p) for p in ("train", "dev", "test")}
sample = np.random.default_rng(1)
parts["dev"], parts["test"] = sample.permutation(parts["dev"])[:n_eval], sample.permutation(parts["test"])[:n_eval]

tok = ValueTokenizer.from_bert("minilm")
base, _, readout = variant.partition("+")
config = config_from_bert("minilm", vocab_size=tok.vocab_size, table_attention=base, n_classes=2, table_match=False, table_numeric=False,
                          max_table_tokens=512, max_cell_tokens=16, max_text_tokens=64)
model = table_encoder(config)
load_bert_table_encoder(model, "minilm")


def row_max(input_ids, token_type_ids, match_ids, numeric_ids, attention_mask):  # unused: this probe predates them
    # [B, R, Lr] -> each row's [CLS] after MiniLM, the largest over the example's rows -> head
    B, R, Lr = input_ids.shape
    flat = attention_mask.view(B * R, Lr).clone()
    flat[:, 0] = True
    C = model.encoder(model.embeddings(input_ids.view(B * R, Lr), token_type_ids.view(B * R, Lr)), flat)
    cls = C[:, 0].view(B, R, -1).masked_fill(~attention_mask[:, :, :1], -1e4)
    return model.head(cls.max(1).values)


forward = row_max if readout == "max" else model


def inputs(index):
    if base == "mafid":
        return pad_row_blocks([row_blocks(tok, *examples.tables[i], config) for i in index], tok.pad_id)
    return model.batch_inputs(examples, index, tok)


def accuracy(part):
    model.eval()
    right = 0
    with torch.no_grad():
        for k in range(0, len(parts[part]), 64):
            index = parts[part][k:k + 64].tolist()
            right += int((forward(*inputs(index)).argmax(1).numpy() == y[index]).sum())
    model.train()
    return right / len(parts[part])


engine = PlainEngine(model, lr, 0.01, 50, steps, 1.0)
rng, losses, log, t0 = np.random.default_rng(0), [], [], time.time()
for step in range(1, steps + 1):
    batch = rng.choice(parts["train"], 16, replace=False).tolist()
    loss = F.cross_entropy(forward(*inputs(batch)), torch.as_tensor(y[batch]))
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    if step % 500 == 0 or step == steps:
        log.append({"step": step, "dev": accuracy("dev"), "train_loss_last_100": float(np.mean(losses[-100:]))})
        print(variant, log[-1], round(time.time() - t0), flush=True)
result = {"variant": variant, "lr": lr, "log": log, "test": accuracy("test"), "seconds": round(time.time() - t0)}
json.dump(result, open(out, "w"))
print(json.dumps(result), flush=True)
