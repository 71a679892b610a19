"""`seqenc bench accuracy` whose rows with the combined (KA + surprise) score also carry the
earlier pivot of ``one_se`` (issue 50): ``dev_cv_f1_one_se_at_half`` and ``f1_one_se_at_half``,
the rule as it was before a combined score got the band's median (training.tasks.thresholds).
Both pivots are read from the same training, so a run compares them on the same scores.

    OMP_NUM_THREADS=1 python docs/probes/combined_threshold_pivot.py bench accuracy --data ../shared/data \
      --json OUT --datasets hdfs --modes interleaved,interleaved+surprise --seeds 0,1,2 --config "$C"

Everything else is the bench's own: the probe only wraps the function that adds the rules' fields.
"""

import sys

from training.bench import accuracy as A
from training.cli.main import main
from training.tasks.thresholds import cv_f1, fit_threshold

_rule_fields, _row = A.rule_fields, A._row


def with_half_pivot(y_dev, p_dev, y_test, p_test, pivot=0.5) -> dict:
    out = _rule_fields(y_dev, p_dev, y_test, p_test, pivot)
    if pivot is None:  # a combined score: also the earlier pivot, 0.5
        from sklearn.metrics import f1_score
        out["dev_cv_f1_one_se_at_half"] = cv_f1("one_se", y_dev, p_dev, pivot=0.5)
        out["f1_one_se_at_half"] = float(f1_score(y_test, p_test >= fit_threshold("one_se", y_dev, p_dev, 0.5),
                                                  zero_division=0))
    return out


def row_with_half_pivot(metrics: dict, task: str, dev: dict | None = None) -> dict:
    """The bench's row, keeping the two fields above (its own keeps only the registry's rules)."""
    return _row(metrics, task, dev) | {k: v for k, v in metrics.items() if k.endswith("_one_se_at_half")}


if __name__ == "__main__":
    A.rule_fields, A._row = with_half_pivot, row_with_half_pivot  # looked up at run time
    sys.exit(main(sys.argv[1:]))
