"""The variants of ``seqenc bench tables``, in one place (the CLI's choices and default derive from
it; training.bench.tables trains them). No heavy imports: the CLI reads it when it builds its parser."""

# MAFiD's ablations (the paper's Table 4 rows; seqenc.mafid): the same model without the EMA across
# rows, with a full-dimensional EMA, or with the fusion's tanh gates removed
MAFID_ABLATIONS = {"mafid_no_ema": {"mafid_ema": "none"}, "mafid_full_ema": {"mafid_ema": "full"},
                   "mafid_no_gate": {"mafid_gate": False}}
TABLE_VARIANTS = ("dense", "mate", "tableformer", "mafid", *MAFID_ABLATIONS)  # training mode "table"
MINILM = "_minilm"  # a variant name + this suffix: the same model initialised from the offline MiniLM
WIDE = "_wide"  # a table variant (+ _minilm) + this suffix: its classifier also reads the overlap features
_ENCODERS = (*TABLE_VARIANTS, *(v + MINILM for v in TABLE_VARIANTS))
VARIANTS = ("dense", "mate", "tableformer", "tvmka", "tvmka_minilm", "mafid", *MAFID_ABLATIONS,
            *(v + MINILM for v in TABLE_VARIANTS), *(v + WIDE for v in _ENCODERS))
# the default --variants: the encoder that learns fastest per CPU second on TabFact, its wide
# version, and TVM-KA; the others (dense, tableformer, mafid, ablations, _minilm) on request
DEFAULT_VARIANTS = ("mate", "mate_wide", "tvmka")
