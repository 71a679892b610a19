# Probe (2026-12-06, docs/training.md "A drifted day"): the checkout stream of
# tests/test_window_threshold.py at demo size, trained on day 1 (every session, and normal sessions
# only), scored on day 1 and on day 2 whose every amount drifted x 1.6; prints ROC AUC and what was
# flagged per task and day. Usage, from the repository root with the venv active:
#   bash docs/probes/drifted_day.sh WORKDIR
set -e
export OMP_NUM_THREADS=1
repo=$(pwd); mkdir -p "$1"; cd "$1"; rm -rf work
python - "$repo" <<'P'
import sys; sys.path.insert(0, sys.argv[1] + "/tests")
from pathlib import Path
from test_window_threshold import _stream, CATALOG
_stream(Path("d1.jsonl"), Path("d1.csv"), "2025-04-01", 300, 0, 1.0)
_stream(Path("d2.jsonl"), Path("d2.csv"), "2025-04-02", 300, 1, 1.6)
c = CATALOG.replace('size = "tiny"\n', 'size = "demo"\n')
c += '\n[tasks.normal_watch]\nsource = "checkout"\nkind = "anomaly"\npositive = "fraud"\ntrain_on = "normal"\nsize = "demo"\n'
Path("seqenc.toml").write_text(c)
P
seqenc ingest events d1.jsonl --root work/data --source checkout --catalog seqenc.toml --labels d1.csv --date 2025-04-01 > /dev/null 2>&1
for t in checkout_watch normal_watch; do seqenc train --catalog seqenc.toml --task $t --workdir work --no-progress > train-$t.log 2>&1; done
seqenc ingest events d2.jsonl --root work/data --source checkout --catalog seqenc.toml --labels d2.csv --date 2025-04-02 > /dev/null 2>&1
for t in checkout_watch normal_watch; do
  for d in 2025-04-01 2025-04-02; do seqenc score --model work/models/$t/bundle --input work/data --out work/pred/$t --date $d --no-progress 2>&1 | grep -v " INFO "; done
done
python - <<'P'
import polars as pl
from sklearn.metrics import roc_auc_score
for t in ("checkout_watch", "normal_watch"):
    for d, lab in (("2025-04-01", "d1.csv"), ("2025-04-02", "d2.csv")):
        p = pl.read_parquet(f"work/pred/{t}/date={d}/part-0.parquet").join(
            pl.read_csv(lab).rename({"session": "sequence_id"}), on="sequence_id")
        y, f = (p["verdict"] == "fraud").to_numpy(), (p["label"] == "fraud").to_numpy()
        print(t, d, "ROC AUC", round(roc_auc_score(y, p["score"]), 3), "flagged", f.sum(), "fraud among them", (f & y).sum(),
              "fraud", y.sum())
P
