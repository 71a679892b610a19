"""Probe (2026-11-28, docs/tables.md "Why the table models sat at chance"): what can a
MiniLM-initialised table encoder tell apart before any training?

For true lookup statements (``seqenc bench table-lookup``) and their tables, three edits:

* ``rows swapped``: the key's row and another row trade places (the truth does not change);
* ``values swapped``: the named column's cells of those two rows trade places (true -> false);
* ``other example``: a different statement with its own table (the scale of a real difference).

Each is the L2 distance between the encoder's output for the original and the edited input,
divided by the distance to the other example (median over the statements). A ratio near 0 means
the encoder cannot see the edit; the head would have to learn it from nothing. Encoders:

* ``dense``: seqenc.table_model's flattening from MiniLM, per-cell positions, [CLS] output; with
  the row, column and match embeddings at zero (what MiniLM itself sees) and as initialised;
* ``row blocks``: MAFiD's per-row blocks (``[CLS] text [SEP] h1 c1 ...``, ordinary positions
  inside a block) through MiniLM, the rows' [CLS] states max-pooled (a per-row cross-encoder).

Run from the repository root (CPU, about a minute)::

    python docs/probes/minilm_init_distinctions.py LOOKUP4.jsonl LOOKUP4_TABLES/ [N]
"""
import json
import random
import statistics
import sys

import torch

from seqenc.mafid import pad_row_blocks, row_blocks
from seqenc.pretrained import config_from_bert, load_bert_table_encoder
from seqenc.table_model import TableExamples, table_encoder
from seqenc.tokenizer import ValueTokenizer

statements, tables_dir = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 100
torch.manual_seed(0)
tok = ValueTokenizer.from_bert("minilm")


def table(name):
    rows = [line.split("#") for line in open(f"{tables_dir}/{name}").read().splitlines() if line.strip()]
    return rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]


def edits(record):
    """(original, rows swapped, values swapped) as (text, header, rows), or None."""
    header, body = table(record["table"])
    words = record["statement"].split(" of ", 1)
    key_row = next((i for i, r in enumerate(body) if f" of {r[0]} is " in record["statement"]
                    or any(f" of {c} is " in record["statement"] for c in r)), None)
    column = next((j for j, h in enumerate(header) if record["statement"].startswith(f"the {h} of ")), None)
    if key_row is None or column is None or len(body) < 2 or not words:
        return None
    other = (key_row + 1) % len(body)
    rows_swapped = list(body)
    rows_swapped[key_row], rows_swapped[other] = body[other], body[key_row]
    values_swapped = [list(r) for r in body]
    values_swapped[key_row][column], values_swapped[other][column] = body[other][column], body[key_row][column]
    if values_swapped[key_row][column] == body[key_row][column]:
        return None  # the two rows hold the same value: the swap changes nothing
    text = record["statement"]
    return (text, header, body), (text, header, rows_swapped), (text, header, values_swapped)


records = [r for r in map(json.loads, open(statements)) if r["label"] == 1]
random.Random(0).shuffle(records)
cases = [c for c in map(edits, records[:4 * n]) if c is not None][:n]

config = config_from_bert("minilm", vocab_size=tok.vocab_size, table_attention="dense", n_classes=2,
                          max_table_tokens=512, dropout=0.0, attn_dropout=0.0)
dense = table_encoder(config).eval()
load_bert_table_encoder(dense, "minilm")
blocks = table_encoder(config_from_bert("minilm", vocab_size=tok.vocab_size, table_attention="mafid", n_classes=2,
                                        max_table_tokens=512, dropout=0.0, attn_dropout=0.0)).eval()
load_bert_table_encoder(blocks, "minilm")


def dense_out(tables):
    data = TableExamples([str(i) for i in range(len(tables))], tables)
    return dense.encode(*dense.batch_inputs(data, range(len(tables)), tok))


def blocks_out(tables):
    ids, types, match, numeric, mask = pad_row_blocks([row_blocks(tok, *t, blocks.config) for t in tables], tok.pad_id)
    B, R, L = ids.shape
    flat = mask.view(B * R, L).clone()
    flat[:, 0] = True
    states = blocks.encoder(blocks.embeddings(ids.view(B * R, L), types.view(B * R, L)), flat)[:, 0].view(B, R, -1)
    return states.masked_fill(~mask[:, :, :1], float("-inf")).max(1).values


def ratios(encode):
    out = {"rows swapped": [], "values swapped": []}
    with torch.no_grad():
        for i, (orig, rows, values) in enumerate(cases):
            other = cases[(i + 1) % len(cases)][0]
            a, b, c, d = encode([orig, rows, values, other])
            scale = (a - d).norm().item()
            out["rows swapped"].append((a - b).norm().item() / scale)
            out["values swapped"].append((a - c).norm().item() / scale)
    return {k: round(statistics.median(v), 6) for k, v in out.items()}


result = {"statements": len(cases), "dense, as initialised": ratios(dense_out)}
with torch.no_grad():
    for emb in (dense.embeddings.row, dense.embeddings.column, dense.embeddings.match, *dense.embeddings.numeric.children()):
        emb.weight.zero_()
result["dense, row / column / match / numeric embeddings zero"] = ratios(dense_out)
result["row blocks (MAFiD's), rows' [CLS] max-pooled"] = ratios(blocks_out)
print(json.dumps(result, indent=2))
