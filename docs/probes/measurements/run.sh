# Probe (2026-12-06, docs/training.md "Measurements are not ids"): the README's labelled block on a
# stream of gen.py, the starter task turned into an anomaly task (the labels only measure), trained
# on day 1, day 2 ingested after and scored with the defaults; then f1.py reads day 2's flags.
# Usage, in a scratch folder holding gen.py's files, with the venv's seqenc on PATH:
#   bash run.sh STREAM TAG [KEY LEFT OUT] [TOML LINE ADDED TO THE TASK]   (KEEP_BINARY=1: a binary task)
set -e
S=$1; TAG=$2; X=$3; CFG=$4; HERE=$PWD; D=$HERE/$S-$TAG
rm -rf "$D"; mkdir -p "$D"; cd "$D"
cat > seqenc.toml <<T
[sources.$S]
kind = "events"
session_field = "session"
ts_field = "at"
label_id_column = "session"
label_column = "verdict"
T
seqenc ingest events "$HERE/$S-2026-05-01.jsonl" --root work/data --source "$S" --catalog seqenc.toml \
  --labels "$HERE/$S-2026-05-01.csv" --date 2026-05-01 > /dev/null 2>&1
seqenc profile --root work/data --source "$S" --write-task seqenc.toml --task-name watch > profile.txt 2>&1
python - "$X" "$CFG" <<'P'
import os, re, sys
left_out, line = sys.argv[1], sys.argv[2]
t = open("seqenc.toml").read()
if os.environ.get("KEEP_BINARY") != "1":  # KEEP_BINARY=1: the starter task as the profile wrote it
    t = re.sub(r'kind = "binary"\npositive = "(\w+)"', 'kind = "anomaly"\npositive = "bad"', t)
if left_out:
    t = t.replace("exclude_keys = [", f'exclude_keys = ["{left_out}", ', 1)
if line:
    t = t.rstrip("\n") + "\n" + line + "\n"
open("seqenc.toml", "w").write(t)
P
grep -A6 "tasks.watch" seqenc.toml
seqenc train --catalog seqenc.toml --task watch --workdir work --no-progress > train.json 2> train.err
seqenc ingest events "$HERE/$S-2026-05-02.jsonl" --root work/data --source "$S" --catalog seqenc.toml \
  --labels "$HERE/$S-2026-05-02.csv" --date 2026-05-02 > /dev/null 2>&1
seqenc score --model work/models/watch/bundle --input work/data --out pred --date 2026-05-02 --no-progress 2>&1 \
  | grep flagged
