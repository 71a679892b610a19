"""Baselines of the TVM-KA paper (section 3), same width and depth as TVM-KA's networks.

* :class:`FlattenedEncoder` -- "flattened encoding": every object of a sequence is flattened
  into one BERT input with boundary markers, limited to ``max_positions`` (512) tokens::

      [CLS] k1 v1 k2 v2 ... [SEP] k1 v1 ... [SEP] ...      token types: key 0, value 1

  Choices: objects end with [SEP] (the object/timestep boundary); inside an object the
  key/value boundary is carried by BERT's token-type (segment) embedding (key tokens type 0,
  value tokens type 1), so no new vocabulary is needed and a pre-trained BERT's type embeddings
  are used as trained. Too long a sequence keeps its *most recent* whole objects (the ones
  nearest the prediction point); the dropped objects are counted and logged.
* :class:`RecordViewEncoder` -- "record view" (de Souza Pereira Moreira et al. 2021,
  Transformers4Rec): each object becomes one vector, then a transformer with object positions
  reads the sequence of object vectors. ``object_encoder="pool"`` (default, as Transformers4Rec
  and the paper's 104M-parameter record view: one BERT over objects) averages the object's
  key/value token embeddings; ``"transformer"`` first runs the object's tokens through an object-level BERT stack
  (positions inside the object) and averages its outputs. At most ``max_positions`` most recent objects are kept.
* :class:`JointTVMKA` -- "joint modeling": TVM and KA trained end to end, the task loss flowing
  through KR(k) into the TVM. The paper's joint model has no shared heads (209M = two full
  BERTs); :func:`joint_config` gives that configuration.

All three end in the same task head as the KA (seqenc.heads). Each builds its own batches
(``batch_inputs``: the one definition of its input, read by training.engine.end_to_end when it trains
and by training.serving.scoring when it scores) and :func:`end_to_end_proba` runs any of them over a set
of sequences. :func:`load_pretrained` loads whichever model a saved directory holds (TVM-KA or
one of these), as named by its ``architecture.json``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from seqenc.config import TVMKAConfig, plain_config
from seqenc.heads import make_head
from seqenc.inference import pad_batch, to_model
from seqenc.links import link_flags, long_repeat_flags
from seqenc.model import TVMKA, Embeddings, Encoder, SaveLoadMixin, init_weights, pool_windows, read_architecture
from seqenc.sequences import TokenizedSequences
from seqenc.table_model import TABLE_MODELS
from seqenc.tokenizer import ValueTokenizer

log = logging.getLogger(__name__)

KEY_TYPE, VALUE_TYPE = 0, 1

# record view: tokens kept per object (an HDFS line is ~20 tokens of keys and values)
RECORD_OBJECT_TOKENS = 64


joint_config = plain_config  # the paper's joint model: two BERT stacks, no head sharing


# --- objects as token lists ----------------------------------------------------------------------


@dataclass
class ObjectSequences:
    """Per sequence, its objects in step order; per object its token ids and token types."""

    sequence_ids: list[str]
    objects: list[list[tuple[list[int], list[int]]]]  # [sequence][object] -> (ids, types)

    @classmethod
    def from_objects(cls, objects: pl.DataFrame, tok: ValueTokenizer,
                     exclude_keys: tuple[str, ...] = ()) -> ObjectSequences:
        """Long-form objects (sequence_id, step, key, value) -> tokenised objects, keys sorted; a
        numeric value is led by its bin token and, with value links / repeats, every value by its
        markers, as in S(k) (seqenc.numeric, seqenc.links)."""
        objects = objects.filter(~pl.col("key").is_in(list(exclude_keys))).sort(["sequence_id", "step", "key"])
        flags = []
        if tok.value_links:
            objects = objects.with_columns(link_flags(objects))
            flags.append("linked")
        if tok.value_repeats:
            objects = objects.with_columns(long_repeat_flags(objects))
            flags.append("seen")
        rows = (
            objects.group_by(["sequence_id", "step"], maintain_order=True)
            .agg(pl.col("key"), pl.col("value"), *flags)
        )
        keys, values = rows["key"].to_list(), rows["value"].to_list()
        links = rows["linked"].to_list() if tok.value_links else [None] * len(keys)
        seens = rows["seen"].to_list() if tok.value_repeats else [None] * len(keys)
        tok.encode_many([k for ks in keys for k in ks] + [v for vs in values for v in vs])
        sequence_ids: list[str] = []
        out: list[list[tuple[list[int], list[int]]]] = []
        for seq, ks, vs, linked, seen in zip(rows["sequence_id"].to_list(), keys, values, links, seens):
            if not sequence_ids or sequence_ids[-1] != seq:
                sequence_ids.append(seq)
                out.append([])
            ids, types = [], []
            for k_ids, v_ids in zip(tok.encode_many(ks), tok.encode_keyed(ks, vs, linked, seen)):
                ids += k_ids + v_ids
                types += [KEY_TYPE] * len(k_ids) + [VALUE_TYPE] * len(v_ids)
            out[-1].append((ids, types))
        return cls(sequence_ids, out)


def flatten_objects(objects: list[tuple[list[int], list[int]]], cls_id: int, sep_id: int,
                    max_len: int) -> tuple[list[int], list[int], int]:
    """One sequence -> (ids, types, number of objects dropped): the most recent objects that fit.

    An object longer than the whole budget is cut to its first tokens (it is then the only one).
    """
    kept: list[tuple[list[int], list[int]]] = []
    used = 1  # [CLS]
    for ids, types in reversed(objects):
        need = len(ids) + 1  # + [SEP]
        if used + need > max_len:
            if not kept:  # a single over-long object: keep its beginning
                room = max_len - used - 1
                kept.append((ids[:room], types[:room]))
            break
        kept.append((ids, types))
        used += need
    flat_ids, flat_types = [cls_id], [KEY_TYPE]
    for ids, types in reversed(kept):
        flat_ids += ids + [sep_id]
        flat_types += types + [KEY_TYPE]
    return flat_ids, flat_types, len(objects) - len(kept)


def flattened_batch(data: ObjectSequences, index: list[int], tok: ValueTokenizer, max_len: int):
    """Padded flattened inputs of some sequences: ids [B, L], types [B, L], mask [B, L] bool."""
    rows, dropped = [], 0
    for i in index:
        ids, types, d = flatten_objects(data.objects[i], tok.cls_id, tok.sep_id, max_len)
        rows.append((ids, types))
        dropped += d
    if dropped:
        log.warning("flattened encoding: %d object(s) beyond the %d-token limit dropped in this batch",
                    dropped, max_len)
    L = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), L), tok.pad_id, dtype=torch.long)
    types = torch.zeros(len(rows), L, dtype=torch.long)
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    for b, (r_ids, r_types) in enumerate(rows):
        ids[b, : len(r_ids)] = torch.as_tensor(r_ids)
        types[b, : len(r_types)] = torch.as_tensor(r_types)
        mask[b, : len(r_ids)] = True
    return ids, types, mask


def record_batch(data: ObjectSequences, index: list[int], tok: ValueTokenizer, max_objects: int,
                 max_object_tokens: int):
    """Padded record-view inputs: ids/types/token mask [B, M, T], object mask [B, M].

    Keeps the ``max_objects`` most recent objects and the first ``max_object_tokens`` tokens of
    each object (counted and logged when anything is cut).
    """
    seqs = [data.objects[i][-max_objects:] for i in index]
    cut_objects = sum(len(data.objects[i]) - len(s) for i, s in zip(index, seqs))
    cut_tokens = sum(max(0, len(o[0]) - max_object_tokens) for s in seqs for o in s)
    if cut_objects or cut_tokens:
        log.warning("record view: %d object(s) beyond %d and %d token(s) beyond %d per object dropped",
                    cut_objects, max_objects, cut_tokens, max_object_tokens)
    M = max(max(len(s) for s in seqs), 1)
    T = max(max((min(len(o[0]), max_object_tokens) for s in seqs for o in s), default=1), 1)
    ids = torch.full((len(seqs), M, T), tok.pad_id, dtype=torch.long)
    types = torch.zeros(len(seqs), M, T, dtype=torch.long)
    for b, s in enumerate(seqs):
        for m, (o_ids, o_types) in enumerate(s):
            n = min(len(o_ids), max_object_tokens)
            ids[b, m, :n] = torch.as_tensor(o_ids[:n])
            types[b, m, :n] = torch.as_tensor(o_types[:n])
    token_mask = ids != tok.pad_id
    return ids, types, token_mask, token_mask.any(-1)


# --- models -------------------------------------------------------------------------------------


class FlattenedEncoder(SaveLoadMixin, nn.Module):
    """One BERT over the flattened objects; the [CLS] output feeds the task head."""

    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.config = config = plain_config(config)
        self.embeddings = Embeddings(config, positional=True)
        self.encoder = Encoder(config, None, drophead=0.0)
        self.head = make_head(config)
        init_weights(self, config.init_std)

    def encode(self, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
        # [B, L] x 3 -> [B, d_model]
        return self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)[:, 0]

    def forward(self, input_ids, token_type_ids, attention_mask) -> torch.Tensor:
        return self.head(self.encode(input_ids, token_type_ids, attention_mask))  # [B, n_outputs]

    def batch_inputs(self, data: ObjectSequences, index: list[int], tok: ValueTokenizer):
        """``forward``'s inputs for the sequences ``index``: their most recent whole objects
        within ``max_positions`` tokens (:func:`flattened_batch`)."""
        return flattened_batch(data, index, tok, self.config.max_positions)


class RecordViewEncoder(SaveLoadMixin, nn.Module):
    """Objects -> one vector each -> a transformer over the object sequence -> task head."""

    def __init__(self, config: TVMKAConfig, object_encoder: str = "pool",
                 max_object_tokens: int = RECORD_OBJECT_TOKENS):
        super().__init__()
        if object_encoder not in ("pool", "transformer"):
            raise ValueError(f"object_encoder={object_encoder!r} is not 'pool' or 'transformer'")
        self.config = config = plain_config(config)
        self.object_encoder = object_encoder
        self.max_object_tokens = max_object_tokens  # an input setting, saved with the model
        # token level: positions inside an object only matter to the transformer variant
        self.embeddings = Embeddings(config, positional=object_encoder == "transformer")
        self.object_layers = Encoder(config, None, drophead=0.0) if object_encoder == "transformer" else None
        # sequence level: a learned [CLS] + object vectors + object-position embeddings
        self.cls = nn.Parameter(torch.zeros(config.d_model))
        self.object_position = nn.Embedding(config.max_positions + 1, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config, None, drophead=0.0)
        self.head = make_head(config)
        init_weights(self, config.init_std)

    def init_options(self) -> dict:
        return {"object_encoder": self.object_encoder, "max_object_tokens": self.max_object_tokens}

    def object_vectors(self, input_ids, token_type_ids, token_mask) -> torch.Tensor:
        # [B, M, T] -> [B, M, d_model]
        B, M, T = input_ids.shape
        flat_ids, flat_types, flat_mask = (t.reshape(B * M, T) for t in (input_ids, token_type_ids, token_mask))
        x = self.embeddings(flat_ids, flat_types)  # [B*M, T, d_model]
        if self.object_layers is not None:
            x = self.object_layers(x, flat_mask | ~flat_mask.any(-1, keepdim=True))  # empty slots stay finite
        w = flat_mask.unsqueeze(-1).to(x.dtype)
        vec = (x * w).sum(1) / w.sum(1).clamp(min=1.0)  # mean over the object's real tokens
        return vec.view(B, M, -1)

    def encode(self, input_ids, token_type_ids, token_mask, object_mask) -> torch.Tensor:
        # ids/types/token_mask [B, M, T], object_mask [B, M] -> [B, d_model]
        B, M, _ = input_ids.shape
        if M + 1 > self.object_position.num_embeddings:
            raise ValueError(f"{M} objects exceed the record view's {self.object_position.num_embeddings - 1} "
                             "object positions; pass max_objects <= max_positions to record_batch")
        objects = self.object_vectors(input_ids, token_type_ids, token_mask)
        x = torch.cat([self.cls.expand(B, 1, -1), objects], 1)  # [B, 1 + M, d_model]
        x = x + self.object_position(torch.arange(M + 1, device=x.device))
        mask = torch.cat([object_mask.new_ones(B, 1), object_mask], 1)
        return self.encoder(self.dropout(self.norm(x)), mask)[:, 0]

    def forward(self, input_ids, token_type_ids, token_mask, object_mask) -> torch.Tensor:
        return self.head(self.encode(input_ids, token_type_ids, token_mask, object_mask))

    def batch_inputs(self, data: ObjectSequences, index: list[int], tok: ValueTokenizer):
        """``forward``'s inputs for the sequences ``index``: their ``max_positions`` most recent
        objects, ``max_object_tokens`` tokens each (:func:`record_batch`)."""
        return record_batch(data, index, tok, self.config.max_positions, self.max_object_tokens)


def joint_inputs(data: TokenizedSequences, index, pad_id: int):
    """Inputs of :meth:`JointTVMKA.forward` for the sequences ``index`` of ``data``."""
    part = data.subset(np.asarray(index))
    ids, mask = pad_batch(part.windows, pad_id)
    return ids, mask, torch.as_tensor(part.window_key), torch.as_tensor(part.key_seq), part.n_sequences


def pack_keys(kr: torch.Tensor, key_seq: torch.Tensor, n_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable regrouping: kr [R, d] with key_seq [R] (rows of a sequence contiguous)
    -> [n_sequences, K_max, d] and key_mask [n_sequences, K_max] bool."""
    counts = torch.bincount(key_seq, minlength=n_sequences)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(len(key_seq), device=kr.device) - starts[key_seq]
    K = max(int(counts.max()) if len(counts) else 1, 1)
    out = kr.new_zeros(n_sequences, K, kr.size(1)).index_put((key_seq, pos), kr)
    mask = torch.zeros(n_sequences, K, dtype=torch.bool, device=kr.device)
    mask[key_seq, pos] = True
    return out, mask


class JointTVMKA(TVMKA):
    """TVM-KA trained end to end: windows -> TVM -> KR(k) (with gradients) -> KA -> task output.

    ``forward`` takes the windows of a batch of sequences: ``input_ids``/``attention_mask``
    [W, L], ``window_key`` [W] (key row of each window), ``key_seq`` [R] (sequence of each key
    row, contiguous), and returns [n_sequences, n_outputs]. The KR standardisation buffers stay
    at identity unless fitted: end to end, the KA's input LayerNorm does that job.
    """

    def forward(self, input_ids, attention_mask, window_key, key_seq, n_sequences: int) -> torch.Tensor:
        cls_vectors = self.tvm.key_representations(input_ids, attention_mask)  # [W, d_model]
        kr = pool_windows(cls_vectors, window_key, len(key_seq))  # [R, d_model]
        reprs, key_mask = pack_keys(kr, key_seq, n_sequences)
        return self.ka(reprs, key_mask)

    def batch_inputs(self, data: TokenizedSequences, index: list[int], tok: ValueTokenizer):
        """``forward``'s inputs for the sequences ``index``: their S(k) windows (:func:`joint_inputs`)."""
        return joint_inputs(data, index, tok.pad_id)


# --- any model: inference and loading -----------------------------------------------------------

END_TO_END_MODELS = (JointTVMKA, FlattenedEncoder, RecordViewEncoder, *TABLE_MODELS)
# every model class a saved directory may hold, by the name its architecture.json gives
MODEL_CLASSES = {cls.__name__: cls for cls in (TVMKA, *END_TO_END_MODELS)}


@torch.no_grad()
def end_to_end_proba(model: nn.Module, data: TokenizedSequences | ObjectSequences, tok: ValueTokenizer,
                     batch_size: int = 64, progress: bool = True) -> np.ndarray:
    """Class probabilities [n_sequences, n_classes] of every sequence of ``data`` (S(k) windows
    for :class:`JointTVMKA`, objects for the other two), in ``data``'s order: batches of
    ``batch_size`` sequences built by the model's own ``batch_inputs``, run where the model is;
    float32 on the CPU. The model runs in eval mode; its training mode is restored after."""
    was_training = model.training
    model.eval()
    n = len(data.sequence_ids)
    parts = []
    for start in tqdm(range(0, n, batch_size), desc=f"{type(model).__name__} scoring", disable=not progress,
                      leave=False):
        inputs = to_model(model.batch_inputs(data, list(range(start, min(start + batch_size, n))), tok), model)
        parts.append(torch.softmax(model(*inputs).float(), -1).cpu())
    model.train(was_training)
    return torch.cat(parts).numpy() if parts else np.zeros((0, model.config.n_outputs), dtype=np.float32)


def load_pretrained(directory, map_location: str = "cpu") -> nn.Module:
    """Whichever model ``save_pretrained`` wrote to ``directory`` (as Hugging Face's
    ``AutoModel``): the class its ``architecture.json`` names, from safetensors + JSON. An
    unknown class name is an error naming that file."""
    arch = read_architecture(directory)
    if arch["class"] not in MODEL_CLASSES:
        raise ValueError(f"{Path(directory) / 'architecture.json'} names architecture {arch['class']!r}, which "
                         f"seqenc does not know (known: {', '.join(sorted(MODEL_CLASSES))})")
    return MODEL_CLASSES[arch["class"]].from_pretrained(directory, map_location)
