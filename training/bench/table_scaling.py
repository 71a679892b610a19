"""The scaling rows of ``seqenc bench tables``: time and memory of one forward and backward pass.

* table encoders (``dense``, ``mate_mask``, ``mate``, ``tableformer``; seqenc.table_model): d_model
  256, 4 layers, 8 heads, batch 1, on a synthetic statement + table of ``tokens`` tokens
  (:func:`synthetic_batch`);
* one layer across ``tokens`` positions (issue 26: MAFiD's multi-row reasoning): ``ema_lowdim``
  (seqenc.ema.LowDimEMA, d_model 256, K = 4) against ``attention`` (seqenc.attention.SelfAttention,
  d_model 256, 8 heads, the default SDPA core, whose CPU kernel works in blocks and never holds
  the L x L scores) and ``attention_eager`` (the same layer with the eager core: the scores and
  probabilities materialised, as in the papers' dense attention) -- the layer the EMA replaces.

Every row runs in its own child process (peak RSS; killed past ``max_mb`` -> ``oom``, past
``max_seconds`` -> ``over_limit``; training.bench.model.run_isolated); seconds are the fastest of
``repeat`` passes after a warm-up; ``peak_mb`` is the child's peak RSS, ``added_mb`` that minus
its RSS before the first pass (what the model and its pass add to Python + torch); a variant
that failed at one length is not run longer (``predicted``). Ratios against ``dense`` (table
encoders) or ``attention`` (layers) at the same length, from the same run: seconds, and
``added_mb`` for memory.
"""

from __future__ import annotations

import json
import sys
import time

SCALING_VARIANTS = ("dense", "mate_mask", "mate", "tableformer")
LAYER_VARIANTS = ("ema_lowdim", "attention", "attention_eager")
BASELINE = {**{v: "dense" for v in SCALING_VARIANTS}, **{v: "attention" for v in LAYER_VARIANTS}}  # ratios against
LAYER_D_MODEL, LAYER_HEADS, EMA_REDUCTION = 256, 8, 4


SCALING_MODEL = {"d_model": 256, "n_layers": 4, "n_heads": 8, "n_shared_heads": 0, "d_ff": 1024, "vocab_size": 4096,
                 "max_positions": 80, "dropout": 0.0, "attn_dropout": 0.0, "max_rows": 4096, "max_columns": 64,
                 "mate_global": 32, "mate_radius": 64}
TEXT_TOKENS, COLUMNS, CELL_TOKENS = 30, 8, 4


def synthetic_batch(tokens: int, seed: int = 0):
    """One statement (TEXT_TOKENS with [CLS] / [SEP]) and a table of COLUMNS columns of
    CELL_TOKENS-token cells, as many rows as fill ``tokens``: forward's inputs, batch 1 (the
    exact-match ids random, the numeric ids zero: they cost their embedding lookups whatever they are)."""
    import torch

    from seqenc.structure import CELL, HEADER, TEXT

    g = torch.Generator().manual_seed(seed)
    segment, rows, cols, pos = [TEXT] * TEXT_TOKENS, [0] * TEXT_TOKENS, [0] * TEXT_TOKENS, list(range(TEXT_TOKENS))
    r = 0
    while len(segment) + COLUMNS * CELL_TOKENS <= tokens:
        for c in range(1, COLUMNS + 1):
            segment += [HEADER if r == 0 else CELL] * CELL_TOKENS
            rows += [r] * CELL_TOKENS
            cols += [c] * CELL_TOKENS
            pos += list(range(CELL_TOKENS))
        r += 1
    L = len(segment)
    ids = torch.randint(6, SCALING_MODEL["vocab_size"], (1, L), generator=g)
    as_tensor = lambda xs: torch.tensor([xs])  # noqa: E731
    match = torch.randint(0, 3, (1, L), generator=g)  # exact-match ids (seqenc.table_inputs): any mix
    return (ids, (as_tensor(segment) != TEXT).long(), as_tensor(segment), as_tensor(rows), as_tensor(cols),
            as_tensor(pos), match, torch.zeros(1, L, 3, dtype=torch.long), torch.ones(1, L, dtype=torch.bool))


def layer_case(variant: str, positions: int):
    """(module, inputs) of a layer row: x [1, positions, d_model] (+ its mask / bias)."""
    import torch

    from seqenc.attention import SelfAttention
    from seqenc.config import TableConfig
    from seqenc.ema import LowDimEMA

    x = torch.randn(1, positions, LAYER_D_MODEL, requires_grad=True)
    if variant == "ema_lowdim":
        return LowDimEMA(LAYER_D_MODEL, EMA_REDUCTION), (x, torch.ones(1, positions, dtype=torch.bool))
    config = TableConfig(d_model=LAYER_D_MODEL, n_heads=LAYER_HEADS, n_shared_heads=0, dropout=0.0, attn_dropout=0.0,
                         attn_backend="eager" if variant == "attention_eager" else "sdpa")
    return SelfAttention(config, None, 0.0), (x, None)


def scaling_child(variant: str, tokens: int, repeat: int, threads: int) -> dict:
    """One row, in this (child) process: the fastest forward + backward of ``repeat`` after a warm-up."""
    import torch

    from parsers.resources import peak_rss_mb
    from seqenc.config import TableConfig
    from seqenc.table_model import TableTextEncoder

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if variant in LAYER_VARIANTS:
        model, batch = layer_case(variant, tokens)
    else:
        model = TableTextEncoder(TableConfig(**SCALING_MODEL, table_attention=variant, max_table_tokens=tokens))
        batch = synthetic_batch(tokens)
    baseline = peak_rss_mb()
    times = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        model(*batch).sum().backward()
        model.zero_grad(set_to_none=True)
        if i:  # the first pass warms up
            times.append(time.perf_counter() - t0)
    return {"tokens": int(batch[0].shape[1]), "seconds": min(times), "peak_mb": peak_rss_mb(),
            "baseline_mb": baseline}


def bench_scaling(s, progress: bool = True) -> list[dict]:
    """The rows for ``s.scaling_tokens`` (table encoders) and ``s.layer_positions`` (layers);
    ``s``: training.bench.tables.TablesBenchSettings."""
    from tqdm.auto import tqdm

    from training.bench.model import run_isolated

    rows = []
    failed: dict[str, str] = {}
    jobs = [(v, t) for t in s.scaling_tokens for v in SCALING_VARIANTS]
    jobs += [(v, t) for t in s.layer_positions for v in LAYER_VARIANTS]
    for variant, tokens in tqdm(jobs, desc="tables scaling", disable=not progress):
        row = {"variant": variant, "tokens": tokens, "seconds": None, "peak_mb": None}
        if variant in failed:  # a shorter input of this variant already failed: so does this one
            rows.append({**row, "status": failed[variant], "predicted": True})
            continue
        argv = [sys.executable, "-m", "training.bench.table_scaling", variant, str(tokens), str(s.repeat),
                str(s.threads)]
        status, out, seen_mb = run_isolated(argv, s.max_mb, s.max_seconds)
        if status == "ok":
            measured = json.loads(out.strip().splitlines()[-1])
            row.update(seconds=round(measured["seconds"], 3), peak_mb=round(measured["peak_mb"], 1),
                       added_mb=round(measured["peak_mb"] - measured["baseline_mb"], 1), tokens=measured["tokens"])
        else:
            row["peak_mb"] = round(seen_mb, 1)
            failed[variant] = status if status in ("oom", "over_limit") else "oom"
            status = failed[variant]
        rows.append({**row, "status": status, "predicted": False})
    base = {(r["variant"], r["tokens"]): r for r in rows if r["status"] == "ok"}
    for r in rows:  # ratios against dense (attention) at the same length, same run
        d = base.get((BASELINE[r["variant"]], r["tokens"]))
        if r["status"] == "ok" and d:
            r["time_vs_baseline"] = round(r["seconds"] / d["seconds"], 3)
            r["memory_vs_baseline"] = round(r["added_mb"] / max(d["added_mb"], 1.0), 3)
    return rows


if __name__ == "__main__":  # a scaling child: VARIANT TOKENS REPEAT THREADS
    print(json.dumps(scaling_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
