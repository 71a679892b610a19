"""Probe (2026-12-07, docs/tables.md "MiniLM's word vectors as the scratch encoder's start"): does
the scratch table encoder read TabFact better when its word embeddings start from MiniLM's?

The scratch encoders (``--mode table``, d_model 128) learn their 4,096-piece WordPiece
vocabulary's embeddings from random in 2,400 + 1,500 updates, so "highest", "most" and
"largest" start as unrelated as "highest" and "lowest". This probe gives every piece of our
vocabulary MiniLM's word vector (the bundled MiniLM-L6-H384; a piece MiniLM's vocabulary holds as
is takes its vector, any other the mean of the pieces MiniLM cuts it into; special tokens stay
random), projects the 384-d vectors onto their first d_model principal components, and scales
them to the random init's standard deviation (``config.init_std``) over all coordinates, the
components' relative variance kept. Everything else is as the bench trains it.

It runs the ``seqenc`` CLI with ``training.engine.end_to_end.table_model`` wrapped, so run one
variant per process (``--variants mate``: one variant trains in this process, not in a spawned
worker, which would not see the wrapper). From the repository root:

    OMP_NUM_THREADS=1 python docs/probes/minilm_word_init.py bench tables \
      --tables ../shared/data/tabfact/tables --train ../shared/data/tabfact/val.jsonl \
      --json OUT --no-scaling --threads 1 --variants mate --seed S
"""
import logging
import sys

import numpy as np
import torch

from seqenc.pretrained import read_bert_state
from seqenc.tokenizer import ValueTokenizer
from training.cli.main import main
from training.engine import end_to_end as E

log = logging.getLogger("minilm_word_init")
_table_model = E.table_model


def minilm_vectors(tok: ValueTokenizer) -> tuple[list[int], np.ndarray]:
    """Our vocabulary's non-special ids and a MiniLM word vector for each ([n, 384])."""
    bert = ValueTokenizer.from_bert("minilm").tokenizer
    table = read_bert_state("minilm")["embeddings.word_embeddings.weight"].numpy()
    ids, rows = [], []
    for i in range(tok.tokenizer.get_vocab_size()):
        if i in tok.special_ids:
            continue
        piece = tok.tokenizer.id_to_token(i)
        j = bert.token_to_id(piece)
        if j is not None:
            vector = table[j]
        else:  # cut by MiniLM; a continuation piece is read as a word of its own
            word = piece[2:] if piece.startswith("##") else piece
            found = [k for k in bert.encode(word, add_special_tokens=False).ids]
            if not found:
                continue
            vector = table[found].mean(axis=0)
        ids.append(i)
        rows.append(vector)
    return ids, np.stack(rows)


def projected(vectors: np.ndarray, d_model: int, std: float) -> np.ndarray:
    """``vectors`` on their first ``d_model`` principal components, scaled to ``std`` overall."""
    centred = vectors - vectors.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    out = centred @ vt[:d_model].T
    return out * (std / out.std())


def table_model(config, data, tok, objects, exclude_keys=(), pretrained=None):
    model, inputs = _table_model(config, data, tok, objects, exclude_keys, pretrained)
    ids, vectors = minilm_vectors(tok)
    weight = model.embeddings.word.weight
    start = projected(vectors, weight.shape[1], float(weight.std()))
    with torch.no_grad():
        weight[torch.tensor(ids)] = torch.tensor(start, dtype=weight.dtype)
    log.warning("probe: %d of %d word embeddings start from MiniLM's (PCA to %d)", len(ids), weight.shape[0],
                weight.shape[1])
    return model, inputs


if __name__ == "__main__":
    E.table_model = table_model  # training.engine.modes loads "end_to_end:table_model" at run time
    sys.exit(main(sys.argv[1:]))
