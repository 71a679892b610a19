# Probe (2026-12-06, docs/training.md "Measurements are not ids"): the README's unlabelled block
# with its defaults on one LogHub 2k log (auto_header, 600 s windows, the profile's starter task),
# trained and scored on the same file; prints the scoring line (the share flagged) and the starter
# task's exclude_keys. KEYS, when given, are left out as well (the starter task before measurements).
# Usage, in a scratch folder with the venv's seqenc on PATH:
#   [WINDOW=SECONDS] bash loghub_share.sh SYSTEM LOGFILE [KEYS...]      (WINDOW: 600 unless given)
S=$1; F=$(realpath "$2"); shift 2; D=$PWD/share-$S
rm -rf "$D"; mkdir -p "$D"; cd "$D" || exit 1
printf '[sources.s]\nkind = "logs"\nauto_header = true\nwindow = %s\n' "${WINDOW:-600}" > seqenc.toml
seqenc ingest logs "$F" --root work/data --source s --catalog seqenc.toml > /dev/null 2> ingest.err
seqenc profile --root work/data --source s --write-task seqenc.toml --task-name w > profile.txt 2>&1
for k in "$@"; do sed -i "s/^exclude_keys = \[/exclude_keys = [\"$k\", /" seqenc.toml; done
seqenc train --catalog seqenc.toml --task w --workdir work --no-progress > train.json 2> train.err
seqenc score --model work/models/w/bundle --input work/data --out pred --no-progress 2>&1 | grep flagged
grep exclude_keys seqenc.toml
