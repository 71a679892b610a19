"""``seqenc bench model``: time and peak memory of one inference pass, TVM-KA vs a flattened BERT.

For N objects x K keys (about ``tokens_per_value`` tokens a value) the same synthetic content is
encoded two ways, same width and depth (default d_model 256, 4 layers, 8 heads), batch 1:

* ``tvmka``: the production path -- S(k) for every key, cut into 512-token windows
  (seqenc.sequences), KR(k) from the TVM in length-sorted batches (seqenc.inference), then the KA.
  Work grows linearly in N: the windows of one key are independent.
* ``flattened_truncated``: the flattened baseline *as it is trained* (seqenc.baselines
  ``flatten_objects``, training/engine/end_to_end.py): the most recent whole objects that fit in
  ``window`` tokens (512 by default: ``max_positions``), one dense BERT input. Its cost stops
  growing once N passes the window -- it simply reads less of the sequence (``objects_kept``
  of ``n_objects``; ``truncated`` true).
* ``flattened_full``: all objects flattened into *one* dense BERT input, no cut (positions as
  many as tokens; ``truncated`` false): what reading the whole sequence densely costs.
  Attention cost grows with the square of the length. (Before issue 21 this row was named
  ``flattened``.)

The machine may be shared and noisy: each row makes up to ``repeat`` passes (default 3, fewer
once ``repeat_budget_s`` = 60 s are spent) and reports the fastest as ``seconds`` (all in
``passes``). Every row runs in its own child process (``python -m training.bench.model``) so that peak memory is the
row's own (``VmHWM`` of the child, parsers.resources: the whole process, torch and weights included;
``baseline_mb`` is what it held before the pass) and a runaway row cannot take the benchmark
down. The parent watches the child's resident memory and wall time:

* ``oom``: the child went over ``--max-mb`` (default 8192: the 8 GB budget) and was
  killed, or died of a MemoryError;
* ``over_limit``: a pass took longer than ``--max-seconds`` (or the child was killed for it);
* either, *predicted* without running (``predicted`` true, with the predicted seconds and MB):
  when the largest measured row of the same model and K extrapolates past a budget (memory
  first), or a smaller N of the same model and K already failed;
* ``ok``.

Every row carries ``predicted``: false when it was run (its seconds and MB are measured), true
when nothing was run (its status, and seconds / MB when present, are extrapolations). The
summary's entries taken from a row carry that row's ``predicted`` too; the Markdown table
writes ``(pred.)`` beside every predicted cell and the plot draws predicted points hollow.

Output: ``{"rows": [{"model", "n_objects", "n_keys", "tokens", "seconds", "peak_mb", "status",
"predicted", ...}], "summary": {...}, "settings": {...}}`` (flattened rows add ``truncated``,
``max_tokens`` and, when measured, ``objects_kept``), a Markdown table beside the JSON (``.md``) and a
log-log plot of seconds against N (``.png``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from parsers.resources import peak_rss_mb

log = logging.getLogger(__name__)

MODELS = ("tvmka", "flattened_truncated", "flattened_full")
FLATTENED = ("flattened_truncated", "flattened_full")


@dataclass
class ModelBenchSettings:
    n_objects: tuple[int, ...] = (50, 300, 1000, 3000)
    n_keys: tuple[int, ...] = (10, 25, 100)
    models: tuple[str, ...] = MODELS
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_shared_heads: int = 4
    window: int = 512  # TVM window (max_positions)
    vocab_size: int = 8192
    tokens_per_value: int = 3
    batch_tokens: int = 16384  # TVM inference batch, padded tokens
    attn_backend: str = "sdpa"
    threads: int = 0  # 0 = torch's default
    max_mb: int = 8192
    max_seconds: float = 300.0
    seed: int = 0
    repeat: int = 3  # passes per row (fewer once repeat_budget_s is spent); seconds = the fastest
    repeat_budget_s: float = 60.0


# --- the child: one row --------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _content(n_objects: int, n_keys: int, tokens_per_value: int, vocab_size: int, seed: int):
    """Key token ids [K] and value token ids [K][N][tokens_per_value], special ids avoided."""
    import numpy as np

    rng = np.random.default_rng(seed)
    keys = rng.integers(6, vocab_size, size=n_keys).tolist()
    values = rng.integers(6, vocab_size, size=(n_keys, n_objects, tokens_per_value)).tolist()
    return [[k] for k in keys], values


def run_row(model: str, n_objects: int, n_keys: int, s: ModelBenchSettings) -> dict:
    """One forward pass, timed, in this process. Returns the row (without status)."""
    import numpy as np
    import torch

    from seqenc.baselines import FlattenedEncoder, flatten_objects
    from seqenc.config import TVMKAConfig
    from seqenc.inference import key_representations
    from seqenc.model import TVMKA
    from seqenc.sequences import TokenizedSequences, value_sequence_windows

    if s.threads:
        torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    pad, cls_id, sep_id, val_sep = 0, 2, 3, 5
    keys, values = _content(n_objects, n_keys, s.tokens_per_value, s.vocab_size, s.seed)
    base = dict(vocab_size=s.vocab_size, d_model=s.d_model, n_layers=s.n_layers, n_heads=s.n_heads,
                n_shared_heads=s.n_shared_heads, d_ff=4 * s.d_model, dropout=0.0, attn_dropout=0.0,
                attn_backend=s.attn_backend)

    if model == "tvmka":
        net = TVMKA(TVMKAConfig(**base, max_positions=s.window, max_windows=10**9)).eval()

        def forward():
            windows, window_key = [], []
            for r, (k, vs) in enumerate(zip(keys, values)):
                w, dropped = value_sequence_windows(k, vs, cls_id, val_sep, s.window, "window", 10**9)
                assert dropped == 0
                windows += w
                window_key += [r] * len(w)
            data = TokenizedSequences(["s"], [str(k) for k in keys], np.zeros(len(keys), dtype=np.int64),
                                      windows, np.array(window_key, dtype=np.int64))
            kr = key_representations(net.tvm, data, pad, batch_tokens=s.batch_tokens, progress=False)
            net.ka(kr[None], torch.ones(1, len(keys), dtype=torch.bool))
            return sum(len(w) for w in windows), len(windows)
    elif model in FLATTENED:
        objects = []
        for i in range(n_objects):
            ids, types = [], []
            for k, vs in zip(keys, values):
                ids += k + vs[i]
                types += [0] * len(k) + [1] * len(vs[i])
            objects.append((ids, types))
        whole = 1 + sum(len(o[0]) + 1 for o in objects)
        n_tokens = s.window if model == "flattened_truncated" else whole
        net = FlattenedEncoder(TVMKAConfig(**base, max_positions=n_tokens)).eval()
        kept = []

        def forward():
            ids, types, dropped = flatten_objects(objects, cls_id, sep_id, n_tokens)
            if dropped and model == "flattened_full":
                raise RuntimeError(f"flattened_full dropped {dropped} objects")  # sized to hold them all
            kept.append(n_objects - dropped)
            ids_t, types_t = torch.tensor([ids]), torch.tensor([types])
            net(ids_t, types_t, torch.ones_like(ids_t, dtype=torch.bool))
            return len(ids), 1
    else:
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")

    baseline_mb = _rss_mb()
    passes: list[float] = []
    with torch.inference_mode():
        while len(passes) < max(1, s.repeat) and sum(passes) < s.repeat_budget_s:
            t0 = time.perf_counter()
            tokens, n_inputs = forward()
            passes.append(time.perf_counter() - t0)
    seconds = min(passes)
    peak_mb = peak_rss_mb()
    row = {"model": model, "n_objects": n_objects, "n_keys": n_keys, "tokens": tokens,
           "seconds": round(seconds, 4), "peak_mb": round(peak_mb, 1), "baseline_mb": round(baseline_mb, 1),
           "inputs": n_inputs, "threads": torch.get_num_threads(), "passes": [round(p, 4) for p in passes]}
    if model in FLATTENED:
        row["objects_kept"] = kept[-1]
    return row


# --- the parent: isolation, limits, prediction -----------------------------------------------------


def run_isolated(argv: list[str], max_mb: float, max_seconds: float, poll: float = 0.05) -> tuple[str, str, float]:
    """Run a child; kill it over max_mb resident or max_seconds wall.

    Returns (status, stdout, observed peak RSS in MB): status "ok", "oom", "over_limit" or "error".
    """
    import psutil

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps, t0, seen_mb, status = psutil.Process(proc.pid), time.monotonic(), 0.0, None
    while proc.poll() is None:
        try:
            seen_mb = max(seen_mb, ps.memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            break
        if seen_mb > max_mb:
            status = "oom"
        elif time.monotonic() - t0 > max_seconds:
            status = "over_limit"
        if status:
            proc.kill()
            break
        time.sleep(poll)
    out, err = proc.communicate()
    if status:
        return status, out, seen_mb
    if proc.returncode != 0:
        if "MemoryError" in err or "DefaultCPUAllocator: can't allocate" in err or proc.returncode == -9:
            return "oom", out, seen_mb
        log.error("bench child failed (exit %s): %s", proc.returncode, err[-2000:])
        return "error", out, seen_mb
    return "ok", out, seen_mb


def expected_tokens(model: str, n_objects: int, n_keys: int, s: ModelBenchSettings) -> int:
    per_value = s.tokens_per_value + 1  # value tokens + [VAL_SEP] (tvmka) or key token (flattened)
    per_object = n_keys * per_value + 1  # + [SEP]
    if model == "flattened_full":
        return 1 + n_objects * per_object
    if model == "flattened_truncated":  # [CLS] + the most recent whole objects that fit (flatten_objects)
        fit = min(n_objects, (s.window - 1) // per_object)
        return 1 + fit * per_object if fit else s.window  # one over-long object is cut to the window
    return n_keys * (2 + n_objects * per_value)  # before window prefixes are repeated


def _predict(model: str, tokens: int, done: list[dict], backend: str = "sdpa") -> tuple[float, float] | None:
    """(seconds, MB) of a row, extrapolated from the largest measured row of the same model and K.

    Time: quadratic in tokens for the dense flattened encoder (attention), linear for TVM-KA
    (windows). Memory (the pass's own increment, peak - baseline): quadratic only for the
    flattened encoder with eager attention, which holds [h, L, L] scores; SDPA's CPU kernels
    work in blocks (measured: near-linear), and TVM-KA's windows are batched."""
    ok = [r for r in done if r["status"] == "ok"]
    if not ok:
        return None
    ref = max(ok, key=lambda r: r["tokens"])
    ratio = tokens / ref["tokens"]
    time_scale = ratio ** 2 if model in FLATTENED else ratio
    mem_scale = ratio ** 2 if (model in FLATTENED and backend == "eager") else ratio
    return ref["seconds"] * time_scale, ref["baseline_mb"] + (ref["peak_mb"] - ref["baseline_mb"]) * mem_scale


def bench_model(s: ModelBenchSettings, progress: bool = True) -> dict:
    from tqdm.auto import tqdm

    plan = [(m, k, n) for m in s.models for k in s.n_keys for n in sorted(s.n_objects)]
    rows: list[dict] = []
    for model, k, n in tqdm(plan, desc="bench model", disable=not progress):
        same = [r for r in rows if r["model"] == model and r["n_keys"] == k]
        tokens = expected_tokens(model, n, k, s)
        row = {"model": model, "n_objects": n, "n_keys": k, "tokens": tokens, "seconds": None,
               "peak_mb": None, "status": None, "predicted": False}
        if model in FLATTENED:
            row.update(truncated=model == "flattened_truncated",
                       max_tokens=s.window if model == "flattened_truncated" else tokens)
        if any(r["status"] in ("oom", "over_limit") for r in same):
            row.update(status=next(r["status"] for r in same if r["status"] in ("oom", "over_limit")),
                       predicted=True)  # a smaller N of this model and K already failed
        elif (guess := _predict(model, tokens, same, s.attn_backend)) and guess[1] > s.max_mb:
            row.update(status="oom", predicted=True, seconds=round(guess[0], 1), peak_mb=round(guess[1], 1))
        elif guess and guess[0] > s.max_seconds:
            row.update(status="over_limit", predicted=True, seconds=round(guess[0], 1), peak_mb=round(guess[1], 1))
        else:
            argv = [sys.executable, "-m", "training.bench.model", json.dumps(asdict(s)), model, str(n), str(k)]
            # the wall limit leaves room for start-up and the repeats; a pass itself must fit max_seconds
            status, out, seen_mb = run_isolated(argv, s.max_mb, s.max_seconds + s.repeat_budget_s + 30)
            if status == "ok":
                measured = json.loads(out.strip().splitlines()[-1])
                row.update(measured, status="ok" if measured["seconds"] <= s.max_seconds else "over_limit")
            else:
                row.update(status=status, peak_mb=round(seen_mb, 1))
        log.info("bench model: %s", row)
        rows.append(row)
    return {"rows": rows, "summary": summarise(rows), "settings": asdict(s)}


def summarise(rows: list[dict]) -> dict:
    """Headline figures from the rows; an entry taken from a row carries its ``predicted``.

    The N-ratio of TVM-KA uses measured (``ok``) rows only; a first failure may be predicted."""

    def find(model, n, k):
        return next((r for r in rows if (r["model"], r["n_objects"], r["n_keys"]) == (model, n, k)), None)

    out: dict = {}
    a, b = find("tvmka", 1000, 25), find("tvmka", 3000, 25)
    if a and b and a["status"] == b["status"] == "ok":
        out["tvmka_seconds_ratio_n3000_over_n1000_k25"] = round(b["seconds"] / a["seconds"], 3)
    big = find("tvmka", 3000, 100)
    if big:
        out["tvmka_n3000_k100"] = {f: big.get(f, False) for f in ("status", "seconds", "peak_mb", "predicted")}
    for model in MODELS:
        ok = [r for r in rows if r["model"] == model and r["status"] == "ok"]
        failed = [r for r in rows if r["model"] == model and r["status"] != "ok"]
        if ok or failed:
            out[f"{model}_largest_ok_tokens"] = max((r["tokens"] for r in ok), default=0)
            out[f"{model}_first_failure"] = (
                {f: min(failed, key=lambda r: r["tokens"]).get(f, False)
                 for f in ("n_objects", "n_keys", "tokens", "status", "predicted")}
                if failed else None
            )
    return out


def table(result: dict) -> str:
    """Markdown rows; every cell of a predicted row (nothing was run) says ``(pred.)``."""
    lines = ["| model | N objects | K keys | tokens | objects read | seconds | peak MB | status |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        pred = " (pred.)" if r.get("predicted") else ""
        sec = "" if r["seconds"] is None else f"{r['seconds']:.2f}{pred}"
        mb = "" if r["peak_mb"] is None else f"{r['peak_mb']:.0f}{pred}"
        read = r.get("objects_kept", r["n_objects"] if r["status"] == "ok" else "")
        lines.append(f"| {r['model']} | {r['n_objects']} | {r['n_keys']} | {r['tokens']} | {read} | {sec} | {mb} | "
                     f"{r['status']}{pred} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    style = {"tvmka": "-", "flattened_truncated": ":", "flattened_full": "--"}
    for model in MODELS:
        for i, k in enumerate(sorted({r["n_keys"] for r in result["rows"]})):
            same = [r for r in result["rows"] if r["model"] == model and r["n_keys"] == k]
            pts = [(r["n_objects"], r["seconds"]) for r in same if r["status"] == "ok"]
            pred = [(r["n_objects"], r["seconds"]) for r in same if r["predicted"] and r["seconds"] is not None]
            if pts:  # one colour per K; line style by model
                ax.plot(*zip(*pts), marker="o", color=f"C{i}", linestyle=style[model], label=f"{model}, K={k}")
            if pred:  # predicted (not run): hollow markers, no line
                ax.plot(*zip(*pred), marker="o", linestyle="none", color=f"C{i}", markerfacecolor="none",
                        label=f"{model}, K={k} (predicted)")
    ax.set(xscale="log", yscale="log", xlabel="objects per sequence (N)", ylabel="seconds per forward pass",
           title="One inference pass, batch 1, CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(result: dict, json_path: str | Path) -> list[Path]:
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2))
    md, png = json_path.with_suffix(".md"), json_path.with_suffix(".png")
    md.write_text(table(result) + "\n\n```json\n" + json.dumps(result["summary"], indent=2) + "\n```\n")
    plot(result, png)
    return [json_path, md, png]


if __name__ == "__main__":  # the child: python -m training.bench.model SETTINGS_JSON MODEL N K
    settings = json.loads(sys.argv[1])
    settings = ModelBenchSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()})
    print(json.dumps(run_row(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), settings)))
