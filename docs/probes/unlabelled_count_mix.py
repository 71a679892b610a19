"""Probe (2026-12-06, docs/training.md "All train: mixing the surprise with the counts' detectors"):
does a score that also reads the event counts put ``unlabelled`` (the masked LM on every train
sequence, no label read) ahead of scikit-learn's detectors on hdfs and bgl?

Two steps, each on the finished runs of ``seqenc bench accuracy --modes unlabelled --workdir W``
(no training: the trainer resumes from its last checkpoint and only recomputes the final phase,
reproducing the bench's test F1 to the last digit; a seed with no run in W is trained there from
scratch with the bench's settings). Run from the repository root (the data: ../shared/data):

    # 1. per-sequence scores: ours, iforest, lof, ocsvm (fitted exactly as training.bench.detectors
    #    does), labels and splits, into OUT/<dataset>-<seed>.npz
    python docs/probes/unlabelled_count_mix.py dump hdfs 0,1,2 W OUT '{"model": {"value_end": true}}'
    # 2. each score and each mix, its contamination share chosen by the robust rule
    #    (training.bench.accuracy.robust_constant) on the mean dev F1 of the CHOICE seeds,
    #    then test F1 on the REPORT seeds at that share (without REPORT: on the choice seeds)
    python docs/probes/unlabelled_count_mix.py mix hdfs OUT 0,1,2 10,11,12,13,14

A third step tries the other way round -- a masked LM that does not learn the anomalies it trains on:
pass 1 trains on every train sequence and scores them; the train sequences it ranks below its
top DROP share become pass 2's train (the unlabelled trainer as ``unlabelled+normal`` runs it, with
every train sequence as the novel values' vocabulary and the same contamination policy on all of
dev as the reference):

    python docs/probes/unlabelled_count_mix.py twopass bgl 0,1,2 0.3 OUT

The mixes put every score on one scale without labels: its empirical distribution function on
the reference (the dev sequences, as the unlabelled trainer's threshold), then either the larger
of two (``max(a,b)``, the surprise scorer's own way of joining lines) or the mean
(``mean(a,b,...)``, a rank average).
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from seqenc.model import TVMKA
from training.bench import accuracy as A
from training.bench.data import load_dataset
from training.bench.detectors import DETECTORS, detector_scores
from training.engine.unlabelled import UnlabelledTrainer, labelled_metrics, policy_threshold, quantile_cut
from training.tasks.baselines import count_vectors
from training.tasks.metrics import task_metrics

DATA = Path("../shared/data")
MIXES = [("max", ("ours", d)) for d in DETECTORS] + [("mean", ("ours", d)) for d in DETECTORS] + \
    [("mean", ("lof", "ocsvm")), ("mean", ("ours", "lof", "ocsvm")), ("mean", ("ours", "ocsvm", "iforest"))]


def bench_inputs(name: str, seed: int, out: Path, config: dict):
    """The dataset, windows, labels, splits and a trainer factory, as training.bench.accuracy
    builds them for an unlabelled row (its own helpers)."""
    ds = load_dataset(name, DATA, out / f"data-{name}-{seed}", seed=seed, limit=A.DEFAULT_LIMITS.get(name))
    sizes = A.bench_sizes("demo", config, unlabelled=True)
    tok, data, y, splits = A.bench_windows(ds, sizes["model"])
    model_cfg, train_cfg = A.unlabelled_configs(ds, tok, sizes, seed)

    def trainer(given: dict, workdir: Path, **kwargs) -> UnlabelledTrainer:
        torch.manual_seed(seed)
        return UnlabelledTrainer(TVMKA(model_cfg), tok, data, y, given, train_cfg, workdir,
                                 A._threshold_policy("unlabelled", name, config), progress=False,
                                 novel_key=ds.event_key, **kwargs)

    return ds, data, y, splits, trainer


def dump(name: str, seeds: list[int], workdir: Path, out: Path, config: dict) -> None:
    """Resume each seed's bench run (as training.bench.accuracy builds it) and save the scores."""
    out.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        ds, data, y, splits, trainer = bench_inputs(name, seed, out, config)
        final = trainer(splits, workdir / f"seed-{seed}" / "runs" / name / "unlabelled").fit()  # resumes: final phase
        ids, X, _ = count_vectors(ds)  # the detectors' input, aligned to the trainer's sequences
        row_of = {s: i for i, s in enumerate(ids)}
        X = X.toarray()[[row_of[s] for s in data.sequence_ids]]
        scores = {d: detector_scores(X, splits["train"], d, seed)[0] for d in DETECTORS}
        np.savez_compressed(out / f"{name}-{seed}.npz", ours=final["probs"][:, 1], y=y, **splits, **scores)
        print(json.dumps({"dataset": name, "seed": seed, "test_f1": final["test"].get("f1")}), flush=True)


def ecdf(reference: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Share of the reference at or below each x (a label-free common scale)."""
    return np.searchsorted(np.sort(reference), x, side="right") / (len(reference) + 1)


def candidates(d: dict) -> dict[str, np.ndarray]:
    tails = {k: ecdf(d[k][d["dev"]], d[k]) for k in ("ours", *DETECTORS)}
    out = {k: d[k] for k in ("ours", *DETECTORS)}
    for how, parts in MIXES:
        stack = np.stack([tails[p] for p in parts])
        # max: ties broken by the mean, so that sequences at the top of both rank first
        out[f"{how}({','.join(parts)})"] = stack.max(0) + 1e-6 * stack.mean(0) if how == "max" else stack.mean(0)
    return out


def f1_at(score: np.ndarray, d: dict, share: float, split: str) -> float:
    cut = policy_threshold(score[d["dev"]], {"policy": "contamination", "share": share})
    return task_metrics(d["y"][d[split]], (score[d[split]] >= cut).astype(int), "binary")["f1"]


def mix(name: str, out: Path, choice: list[int], report: list[int]) -> None:
    runs = {s: dict(np.load(out / f"{name}-{s}.npz")) for s in choice + report}
    scored = {s: candidates(d) for s, d in runs.items()}
    for key in scored[choice[0]]:
        curve = {f"dev_f1_at_share_{sh}": np.mean([f1_at(scored[s][key], runs[s], sh, "dev") for s in choice])
                 for sh in A.SHARE_GRID}
        share = A.robust_constant(curve)
        seeds = report or choice
        f1s = [f1_at(scored[s][key], runs[s], share, "test") for s in seeds]
        aucs = [roc_auc_score(runs[s]["y"][runs[s]["test"]], scored[s][key][runs[s]["test"]]) for s in seeds]
        print(f"{key:26s} share {share:<5} dev F1 (choice seeds) {curve[f'dev_f1_at_share_{share}']:.3f} | "
              f"test F1 {np.mean(f1s):.3f} ({' / '.join(f'{f:.3f}' for f in f1s)}) test ROC AUC {np.mean(aucs):.3f}")


def twopass(name: str, seeds: list[int], drop: float, out: Path, config: dict) -> None:
    """Pass 1 on every train sequence (train scored too); pass 2 on those below its top ``drop``
    share; dev F1 over the share grid, the robust share on their mean, test F1 at it."""
    rows = []
    for seed in seeds:
        ds, data, y, splits, trainer = bench_inputs(name, seed, out, config)
        run = out / f"twopass-{name}-{seed}-{drop}"
        first = trainer(splits, run / "pass1", score_train=True).fit()
        train = splits["train"]
        scores = first["probs"][train, 1]
        kept = train[scores <= quantile_cut(scores, 1.0 - drop)]
        second = trainer({**splits, "train": kept, "vocabulary": train}, run / "pass2")
        second.fit()
        row = {"seed": seed, "kept": len(kept), "anomalous_share_kept": round(float(y[kept].mean()), 3),
               "anomalous_share_train": round(float(y[train].mean()), 3),
               "novel_values": 0 if second.novel is None else len(second.novel.values)}
        for share in A.SHARE_GRID:
            probs, cut = second.rescore({"policy": "contamination", "share": share})
            row[f"dev_f1_at_share_{share}"] = labelled_metrics(y, probs, splits["dev"], cut).get("f1")
            row[f"test_f1_at_share_{share}"] = labelled_metrics(y, probs, splits["test"], cut).get("f1")
        print(json.dumps(row), flush=True)
        rows.append(row)
    curve = {f"dev_f1_at_share_{sh}": np.mean([r[f"dev_f1_at_share_{sh}"] for r in rows]) for sh in A.SHARE_GRID}
    share = A.robust_constant(curve)
    f1s = [r[f"test_f1_at_share_{share}"] for r in rows]
    print(f"two passes, drop {drop}: share {share}, dev F1 {curve[f'dev_f1_at_share_{share}']:.3f}, "
          f"test F1 {np.mean(f1s):.3f} ({' / '.join(f'{f:.3f}' for f in f1s)})")


if __name__ == "__main__":
    if sys.argv[1] == "twopass":
        twopass(sys.argv[2], [int(s) for s in sys.argv[3].split(",")], float(sys.argv[4]), Path(sys.argv[5]),
                json.loads(sys.argv[6]) if len(sys.argv) > 6 else {})
    elif sys.argv[1] == "dump":
        dump(sys.argv[2], [int(s) for s in sys.argv[3].split(",")], Path(sys.argv[4]), Path(sys.argv[5]),
             json.loads(sys.argv[6]) if len(sys.argv) > 6 else {})
    else:
        mix(sys.argv[2], Path(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")],
            [int(s) for s in sys.argv[5].split(",")] if len(sys.argv) > 5 else [])
