"""Anomaly detection without labels: the TVM's masked LM, scored by its surprise and novel values.

A binary task where no label trains anything. The TVM learns the train sequences by masked LM
(all of them, unlabelled; or those a user marks as normal, as DeepLog and LogBERT train on
normal logs only -- the caller passes exactly those as ``splits["train"]``), and each sequence
is scored by how surprising its values are to it (seqenc.surprise: every value masked, its
negative log-likelihood taken five ways, each (key, statistic) scored by how far it lies into
the upper tail of the *reference* sequences, the largest of these). The KA exists (the bundle
is a plain TVMKA, ``task="binary"``) but is never trained and never read: the fitted scorer has
no KA line (``SurpriseScorer.uses_ka`` False), and training.serving.scoring scores such a bundle with
the surprise alone, plus its novel values.

**Novel values** (seqenc.novel_values; ``novel_key``, default ``"event"``, the log line's
template id): the values of that key that ``splits["vocabulary"]`` holds (default: the train
sequences; the bench and ``train_on = "normal"`` pass every train sequence while the masked LM
reads the normal ones) and ``splits["train"]`` never does. A sequence holding one scores above
every tail line (seqenc.surprise.NOVEL_SCORE), as DeepLog flags a log key never seen in normal
execution. With the masked LM on every train sequence nothing is novel. Why: on bgl the
surprise flagged normal windows with rare parameters before alert windows at strict thresholds;
11-12 alert-only event types sit in 78-100 % of the alert windows and in no normal one
(docs/training.md, "Novel values").

Threshold policies (``THRESHOLD_POLICIES``), both on the reference sequences' scores:

* ``{"policy": "contamination", "share": s}``, 0 < s <= 0.5 (scikit-learn's convention): the
  expected share of anomalies among the sequences; the threshold is the (1 - s) quantile of the
  reference scores, so about s of them are flagged (at most s: ties at the cut are not,
  :func:`quantile_cut`), and the scorer's tail lines are fitted
  without the top s of the reference (SurpriseScorer.fit's ``trim``: those are the anomalies);
* ``{"policy": "quantile", "q": q}``, 0 < q < 1: the q-quantile of the reference scores -- meant
  for a clean reference (sequences the user declares normal, e.g. a quiet window), where q
  says how many of the normal sequences may be flagged (1 - q).

The reference is ``splits["reference"]`` when given, else ``splits["dev"]``: the calibration
and the threshold are fitted on sequences the masked LM never read (it memorises its train
sequences, seqenc.surprise), and labels play no part. Labels (``y``: -1 none, 0 normal, 1
anomaly) only evaluate: dev and test metrics are computed on their labelled rows.

Cost: the surprise masks values, one forward pass per masked copy of a window. ``stride``
(default ``STRIDE``) masks every s-th value of a window at once (s copies per window instead of
one per value; seqenc.surprise._masked_copies); only the sequences of the splits that are
scored (dev, test and the reference; train too with ``score_train``) are computed, the other
rows of ``probs`` are NaN. With several data-parallel ranks each scores its share of those
sequences and all gather the statistics (training.engine.sharding).

Phases (training.engine.phased, checkpoints and resume as the other trainers): TVM masked-LM
pre-training, ``rounds`` further TVM phases of ``tvm_steps_per_round`` steps (as many TVM
steps as an interleaved run makes; no KA steps), then ``final``: statistics, scorer, threshold,
metrics.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np

from seqenc.model import TVMKA
from seqenc.novel_values import NOVEL_KEY, NovelValues, skipped_ids
from seqenc.sequences import TokenizedSequences
from seqenc.surprise import STATS, SurpriseScorer, probability_score, score_probability
from seqenc.tokenizer import ValueTokenizer
from training.engine.engines import data_parallel, make_engine
from training.engine.phased import PhasedTrainer
from training.engine.rank_share import RankShare
from training.engine.sharding import sharded_key_surprise
from training.engine.trainer import MaskedLMSteps, rank_mlm_batches
from training.tasks.kinds import KINDS
from training.tasks.metrics import split_metrics

log = logging.getLogger(__name__)

THRESHOLD_POLICIES = KINDS["anomaly"].threshold_policies  # training.tasks.kinds
STRIDE = 8  # values masked together per copy: every 8th value (about the 15% MLM rate), seqenc.surprise


def check_threshold(threshold: dict) -> dict:
    """The threshold policy, validated: ``{"policy": "contamination", "share": s}`` with
    0 < s <= 0.5 or ``{"policy": "quantile", "q": q}`` with 0 < q < 1; a ValueError otherwise."""
    policy = (threshold or {}).get("policy")
    if policy not in THRESHOLD_POLICIES:
        raise ValueError(f"threshold policy {policy!r} is not one of {THRESHOLD_POLICIES}")
    if policy == "contamination":
        share = threshold.get("share")
        if not isinstance(share, int | float) or not 0 < share <= 0.5:
            raise ValueError(f"contamination share must be a number in (0, 0.5], got {share!r}")
        return {"policy": policy, "share": float(share)}
    q = threshold.get("q")
    if not isinstance(q, int | float) or not 0 < q < 1:
        raise ValueError(f"quantile q must be a number in (0, 1), got {q!r}")
    return {"policy": policy, "q": float(q)}


def quantile_cut(scores: np.ndarray, q: float) -> float:
    """The threshold (flag ``score >= cut``) that flags the scores strictly above the q quantile of
    ``scores`` (numpy's linear interpolation): the quantile itself, or the next float above it when
    a score equals it. So a block of tied scores at the quantile is never flagged whole, and at
    most the share 1 - q of ``scores`` is flagged (plus one, the interpolation's step) --
    scikit-learn's convention (its detectors flag a ``score_samples`` strictly below the
    contamination percentile: ties at the cut are inliers).

    Why (issue 50): HDFS blocks repeat their event sequences, so scores tie in large blocks. With
    ``>=`` at the quantile, LOF at contamination 0.5 flagged 98.7 % of hdfs's test blocks (seed 10:
    89 % tied at the cut; ROC AUC 0.51, chance), so its F1 (0.876) was that of flagging everything,
    not of detecting anything."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) == 0:
        raise ValueError("no reference sequences to set the threshold on")
    cut = float(np.quantile(scores, q))
    return float(np.nextafter(cut, np.inf)) if bool(np.any(scores == cut)) else cut


def policy_threshold(reference_scores: np.ndarray, threshold: dict) -> float:
    """The decision threshold (flag ``score >= threshold``) the policy gives on the reference
    sequences' scores: above their (1 - share) or q quantile (:func:`quantile_cut`: ties at the
    quantile are not flagged, so at most the share, or 1 - q, of the reference is)."""
    threshold = check_threshold(threshold)
    q = 1.0 - threshold["share"] if threshold["policy"] == "contamination" else threshold["q"]
    return quantile_cut(reference_scores, q)


# the label-free rule of a clean reference (normal sequences only: train_on = "normal", the bench's
# +normal rows), whose q the anomaly kind names (training.tasks.kinds: clean_reference_threshold)
CLEAN_REFERENCE_RULE = ("the {q} quantile of the clean reference's scores (normal sequences only, so about "
                        "{percent:g} % of normal sequences are flagged)")
LABEL_FREE_Z = 3.5  # Iglewicz and Hoaglin (1993): a modified z-score above 3.5 is an outlier
# nats: the spread never below that of calibrated tail scores. -log of a uniform tail probability
# is Exp(1), whose MAD is asinh(1/2), so its MAD as a normal sigma is 0.713 (label_free_threshold)
LABEL_FREE_MIN_SPREAD = math.asinh(0.5) / 0.6745
LABEL_FREE_RULE = (f"modified z-score > {LABEL_FREE_Z} on the reference scores (median and MAD, scores below 0 taken "
                   f"as 0, the spread at least {LABEL_FREE_MIN_SPREAD:.3f} nats, that of calibrated tail scores; "
                   "Iglewicz and Hoaglin)")


def label_free_threshold(reference_probs: np.ndarray) -> float:
    """A threshold on P(anomaly) that no label chose: the score (the logit of the probability,
    unsquashed: the scorer's own tail score, seqenc.surprise.squash) whose modified z-score
    among the reference sequences' scores is ``LABEL_FREE_Z``: ``median + 3.5 * spread``, the
    spread ``MAD / 0.6745`` but at least ``LABEL_FREE_MIN_SPREAD``. Median and MAD stay put
    under a contamination below one half, so the rule fits a reference with anomalies in it as
    well as a clean one; 3.5 is the textbook's constant, not one measured on our data.

    Why the spread has a floor (issue 50, item 4): a tail score is -log of a tail probability,
    in nats, and most sequences of a stream are surprising nowhere, so their scores sit in a
    tight block (60-75 % of bgl's windows at one score; a made-up freight stream 60 % within
    0.05 nats; Zookeeper_2k's bulk with a MAD of 0.22). The MAD is then that block's width, not the
    spread of the scores that matter, and the cut lands just above the block: 29 % of
    Zookeeper_2k and 37 % of the freight stream (7.7 % anomalous) were flagged, 31-51 % of
    value_anomaly's dev (10 % anomalous) under the ``anomaly`` kind's default. The floor is the
    spread of calibrated tail scores: if the tail probabilities of ordinary sequences were
    uniform, their scores would be Exp(1), whose MAD as a normal sigma is asinh(1/2) / 0.6745 =
    0.713 nats. So a sequence is flagged only when its tail probability is at least e^2.5 (~12)
    times smaller than the median sequence's (about 4 % of a calibrated stream of ordinary
    sequences: median ln 2, cut ln 2 + 2.5). The same floor covers a MAD of 0 (over half the
    reference at one score), where a mean-absolute-deviation fallback was used before.

    How the floor was chosen (docs/training.md, "The label-free rule on made-up streams"): first
    1.5 nats, on 12 dev rows of the bench (seeds 0-2; bgl, hdfs, value_anomaly, ``unlabelled``
    and ``unlabelled+normal``). That floor flagged none of a made-up jobs stream's stuck jobs
    (ranked at 0.99-1.00, 3.1-4.3 nats above a median 72 % of the jobs tie at), and the
    ``unlabelled+normal`` rows have read a quantile of their clean reference since. Re-chosen
    (2026-12-07) on the rows the rule serves: the bench's all-train rows (dev seeds 0-2, each
    scorer fitted as the bench fits it and as the ``anomaly`` kind's default does: 6 rows) and
    day 2 of three made-up streams (checkout, jobs, logins; trained on day 1, defaults), mean
    F1 over the 9 rows 0.510 / **0.521** / 0.427 / 0.346 / 0.297 / 0.244 with a floor of 0.5 /
    0.713 / 1 / 1.25 / 1.5 / 2 (the 6 bench rows alone: 0.336 / 0.341 / 0.317 / 0.309 / 0.294 /
    0.296), and reported on streams and seeds nothing was chosen on.

    Why scores below 0 count as 0 (issue 50, a session later): a tail line extrapolated below its
    threshold gives negative scores -- down to -27.6, the probability's clip -- to sequences in no
    tail at all, and their spread is noise. HealthApp_2k cut into 50 s windows had 60 % of its
    150 windows at -27.6, so the cut sat at -22.4 and flagged 39 %; with the scores taken as
    the tail probabilities they estimate (at most 1, so -log p >= 0) it flags 10 %. Chosen on the
    same 12 dev rows: mean dev F1 0.616 / 0.500 (cut on the reference / on the day) against 0.597 /
    0.481 unclamped, floors 1 and 2 nats lower clamped too (0.612 / 0.481, 0.609 / 0.498); the
    gain is on the all-train rows of bgl (0.088 -> 0.154) and hdfs (0.263 -> 0.432)."""
    score = probability_score(reference_probs)  # the scorer's own tail score (seqenc.surprise.squash undone)
    score = np.maximum(score[~np.isnan(score)], 0.0)  # -log of a tail probability: below 0 is the line's extrapolation
    if len(score) == 0:
        raise ValueError("no reference sequences to set the threshold on")
    median = float(np.median(score))
    spread = max(float(np.median(np.abs(score - median))) / 0.6745, LABEL_FREE_MIN_SPREAD)  # MAD as a normal sigma
    return float(score_probability(np.array(median + LABEL_FREE_Z * spread)))


def labelled_metrics(y: np.ndarray, probs: np.ndarray, idx: np.ndarray, threshold: float) -> dict:
    """Binary metrics of the labelled rows (y >= 0) among ``idx``; {} when there are none."""
    idx = np.asarray(idx, dtype=np.int64)
    idx = idx[y[idx] >= 0]
    if len(idx) == 0:
        return {}
    return split_metrics(y[idx], probs[idx], "binary", threshold)


def unlabelled_plan(cfg, batches_per_epoch: int | None = None) -> list[tuple[str, int, int]]:
    """``(kind, round, steps)``: TVM pre-training, one TVM phase per round, ``final``."""
    pretrain = cfg.pretrain_steps
    if cfg.pretrain_epochs and batches_per_epoch:
        pretrain = math.ceil(cfg.pretrain_epochs * batches_per_epoch)
    return [("tvm", 0, pretrain)] + [("tvm", r, cfg.tvm_steps_per_round) for r in range(1, cfg.rounds + 1)] + \
        [("final", cfg.rounds + 1, 0)]


class UnlabelledTrainer(MaskedLMSteps, PhasedTrainer):
    """The masked LM on ``splits["train"]``, then surprise scores and a threshold policy (module
    docstring). ``kwargs``: the hooks of training.engine.phased.PhasedTrainer (log_metrics, progress,
    run_ids, on_phase_end). After :meth:`fit`, ``surprise`` is the fitted scorer (its
    ``to_dict()`` goes into the bundle's metadata) and ``history`` the losses."""

    def __init__(self, model: TVMKA, tok: ValueTokenizer, data: TokenizedSequences, y: np.ndarray,
                 splits: dict[str, np.ndarray], cfg, workdir: str | Path, threshold: dict,
                 stride: int | None = STRIDE, score_train: bool = False, novel_key: str | None = NOVEL_KEY,
                 share: RankShare | None = None, **kwargs):
        if model.config.task != "binary":
            raise ValueError(f"unlabelled anomaly detection is a binary task, not {model.config.task!r}")
        if cfg.mlm_sequences != "all":
            raise ValueError("the unlabelled trainer's masked LM reads splits['train'] as given; pass the normal "
                             "train sequences as 'train' instead of mlm_sequences='normal'")
        self.threshold_policy = check_threshold(threshold)
        if len(splits["train"]) == 0:
            raise ValueError("no train sequences for the masked LM")
        share = share or RankShare.of(data, *data_parallel(cfg.deepspeed))  # this rank's (training.engine.rank_share)
        mlm = rank_mlm_batches(share, np.asarray(splits["train"], dtype=np.int64), tok, cfg, model)
        super().__init__(model, np.asarray(y, dtype=np.int64), splits, cfg, workdir, "binary",
                         unlabelled_plan(cfg, mlm.batches_per_epoch), **kwargs)
        self.tok, self.data, self.share, self.mlm = tok, share.index, share, mlm
        self.work |= {"held_sequences": share.local.n_sequences, "held_windows": len(share.local.windows)}
        self.stride, self.score_train, self.novel_key = stride, score_train, novel_key
        self.novel: NovelValues | None = None  # seqenc.novel_values
        self.novel_counts: np.ndarray | None = None  # [n_sequences] the novel values each holds
        self.surprise: SurpriseScorer | None = None
        self.surprise_stats: np.ndarray | None = None  # [n_key_rows, len(STATS)], NaN where not scored
        n_tvm = sum(n for kind, _, n in self.plan if kind == "tvm")
        self.engines = {"tvm": make_engine(model.tvm, cfg.lr_tvm, cfg.weight_decay, cfg.warmup_steps, n_tvm,
                                           cfg.grad_clip, cfg.deepspeed)}

    @property
    def reference(self) -> np.ndarray:
        return np.asarray(self.splits.get("reference", self.splits["dev"]), dtype=np.int64)

    def scored(self) -> np.ndarray:
        """The sequences whose surprise is computed: dev, test, the reference (and train)."""
        parts = [self.splits["dev"], self.splits["test"], self.reference]
        if self.score_train:
            parts.append(self.splits["train"])
        return np.unique(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))

    # --- phases --------------------------------------------------------------------------------
    def run_phase(self, kind: str, round_no: int, steps: int) -> dict | None:
        if kind == "tvm":
            self.tvm_steps(steps, "TVM pre-training" if round_no == 0 else f"round {round_no} TVM MLM")
            return None
        if kind == "final":
            self.fit_surprise()
            return self.evaluate()
        raise ValueError(f"unknown phase {kind!r}")

    def fit_surprise(self) -> None:
        """Surprise statistics of the scored sequences from the final TVM; the scorer's tail
        lines fitted on the reference sequences, without a KA line (:meth:`fit_scorer`)."""
        scored, tok, t0 = self.scored(), self.tok, time.perf_counter()
        # with several data-parallel ranks each scores its share of the sequences (training.engine.sharding)
        stats = sharded_key_surprise(self.model.tvm, self.share, scored, mask_id=tok.mask_id,
                                     val_sep_id=tok.val_sep_id, pad_id=tok.pad_id, markers=tok.marker_kinds,
                                     progress=self.progress, stride=self.stride)
        self.work["surprise_sequences"] += len(self.share.local_of(scored))
        self.work["surprise_seconds"] += time.perf_counter() - t0
        self.surprise_stats = np.full((len(self.data.keys), len(STATS)), np.nan, dtype=np.float32)
        offsets = self.data.key_rows_of()
        rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in scored])
        self.surprise_stats[rows] = stats
        self.fit_novel()
        self.surprise = self.fit_scorer(self.threshold_policy)

    def fit_novel(self) -> None:
        """The novel values of ``novel_key`` (seqenc.novel_values): held by
        ``splits["vocabulary"]`` (default: the train sequences), never by the train sequences
        the masked LM read. None when the key is off or absent from train; the scorer is then
        the surprise alone."""
        self.novel, self.novel_counts = None, None
        if self.novel_key is None:
            return
        train = np.asarray(self.splits["train"], dtype=np.int64)
        vocabulary = np.asarray(self.splits.get("vocabulary", train), dtype=np.int64)
        # each data-parallel rank reads its own sequences' values, then all gather (training.engine.rank_share)
        self.novel, self.novel_counts = self.share.novel_values(train, vocabulary, self.novel_key,
                                                                self.tok.val_sep_id, skipped_ids(self.tok))
        if self.novel is None:
            log.info("no values of key %r in the train sequences: no novel values line", self.novel_key)
            return
        log.info("novel values: %d values of key %r that the masked LM's sequences never hold",
                 len(self.novel.values), self.novel_key)

    def fit_scorer(self, threshold: dict, novel: bool = True) -> SurpriseScorer:
        """The scorer a policy fits on the computed statistics: under ``contamination`` every
        tail line is fitted without the top ``share`` of the reference (SurpriseScorer.fit's
        ``trim``: the anomalies the policy expects there); under ``quantile`` (a clean
        reference) on all of it. ``novel`` False: without the novel values (the surprise alone)."""
        trim = check_threshold(threshold).get("share", 0.0)
        return SurpriseScorer.fit(np.nan_to_num(self.surprise_stats), self.data, None, self.reference,
                                  stride=self.stride, trim=trim, novel=self.novel if novel else None)

    def probabilities(self, scorer: SurpriseScorer | None = None) -> np.ndarray:
        """[n_sequences, 2]: column 1 = sigmoid(surprise score) of ``scorer`` (default the fitted
        one); NaN rows where not scored."""
        scorer = scorer or self.surprise
        if scorer is None:
            raise RuntimeError("the surprise is fitted in the final phase")
        probs = scorer.combine(None, np.nan_to_num(self.surprise_stats), self.data,
                               self.novel_counts if scorer.novel is self.novel else None)
        probs[np.setdiff1d(np.arange(self.data.n_sequences), self.scored())] = np.nan
        return probs

    def rescore(self, threshold: dict, novel: bool = True) -> tuple[np.ndarray, float]:
        """(probabilities, threshold) that another policy gives from the same final TVM's
        statistics (no forward pass): to compare policies on dev (training.bench.accuracy);
        ``novel`` False: the surprise alone, without the novel values."""
        probs = self.probabilities(self.fit_scorer(threshold, novel))
        return probs, policy_threshold(probs[self.reference, 1], threshold)

    def evaluate(self, threshold: float | None = None, splits: tuple[str, ...] = ("dev", "test")) -> dict:
        """Threshold from the policy on the reference scores (unless given); metrics on the
        labelled rows of ``splits`` ({} where a split has none)."""
        probs = self.probabilities()
        if threshold is None:
            threshold = policy_threshold(probs[self.reference, 1], self.threshold_policy)
        out = {"threshold": threshold, "probs": probs, "policy": self.threshold_policy}
        for split in splits:
            out[split] = labelled_metrics(self.y, probs, self.splits[split], threshold)
        return out

    # --- checkpoint contents -------------------------------------------------------------------
    def rng_sources(self):
        return {"mlm": self.mlm.generator}, {"mlm": self.mlm.rng}

    def extra_state(self) -> dict:
        return {"mlm_order": [int(i) for i in self.mlm._order]}

    def load_extra_state(self, state: dict) -> None:
        self.mlm._order = list(state["mlm_order"])
