"""Batched inference: windows -> KR(k) for every key of every sequence -> KA predictions.

KR computation is batched across keys *and* sequences: all windows are sorted by length and
packed into batches of about ``batch_tokens`` tokens (little padding), encoded by the TVM, and
the window [CLS] vectors are pooled back per key. The same functions refresh the KR cache
during training and score new data in production.

Devices: the model's parameters decide. :func:`model_device` says where a module lives and
:func:`to_model` moves a batch there (floating-point tensors also to the module's dtype, e.g.
bf16 under DeepSpeed mixed precision); every batch the trainers and scorers build passes
through it. Batches are built on the CPU (token lists, the KR cache on disk) and results come
back to the CPU as float32.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from seqenc.model import TVMKA, KeyAggregator, TemporalValueModeler, pool_windows
from seqenc.sequences import TokenizedSequences


def model_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's parameters (its buffers' if it has none; CPU if neither)."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def model_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype of a module's floating-point parameters (float32 if it has none)."""
    for tensor in module.parameters():
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def to_model(batch, module: torch.nn.Module):
    """``batch`` (a tensor, or a tuple / list of tensors and other values) on ``module``'s device;
    floating-point tensors also in its dtype. Other values (e.g. a count) pass unchanged."""
    device, dtype = model_device(module), model_dtype(module)

    def move(x):
        if isinstance(x, tuple | list):  # nested, e.g. a head's bag of values
            return type(x)(move(y) for y in x)
        if not isinstance(x, torch.Tensor):
            return x
        return x.to(device, dtype) if x.is_floating_point() else x.to(device)

    return move(batch)


def pad_batch(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists: -> input_ids [B, L] long, attention_mask [B, L] bool."""
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return ids, ids != pad_id


def length_batches(lengths: np.ndarray, batch_tokens: int, max_rows: int = 4096) -> list[np.ndarray]:
    """Indexes sorted by length, cut into batches of at most ~batch_tokens padded tokens."""
    order = np.argsort(lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * lengths[order[end]] <= batch_tokens \
                and end - start < max_rows:
            end += 1
        batches.append(order[start:end])
        start = end
    return batches


@torch.no_grad()
def key_representations(
    tvm: TemporalValueModeler,
    data: TokenizedSequences,
    pad_id: int,
    batch_tokens: int = 32768,
    progress: bool = True,
) -> torch.Tensor:
    """KR(k) for every key row of ``data``: [n_key_rows, d_model] float32 on CPU, computed
    where the TVM is.

    The TVM runs in eval mode (no dropout, no DropHead); its training mode is restored after.
    A window that occurs more than once (a table's column joined to each of its statements, a
    constant key across sessions) is encoded once: in eval mode its [CLS] vector depends on its
    tokens only.
    """
    was_training = tvm.training
    tvm.eval()
    first: dict[bytes, int] = {}  # a window's tokens (int64 bytes: compact, exact) -> its unique index
    window_unique = np.fromiter((first.setdefault(np.asarray(w, dtype=np.int64).tobytes(), len(first))
                                 for w in data.windows), dtype=np.int64, count=len(data.windows))
    unique = [np.frombuffer(key, dtype=np.int64).copy() for key in first]
    del first
    lengths = np.fromiter((len(w) for w in unique), dtype=np.int64, count=len(unique))
    cls_vectors = torch.empty(len(unique), tvm.config.d_model)
    for idx in tqdm(length_batches(lengths, batch_tokens), desc="key representations",
                    disable=not progress, leave=False):
        ids, mask = pad_batch([unique[i] for i in idx], pad_id)
        cls_vectors[torch.as_tensor(idx)] = tvm.key_representations(*to_model((ids, mask), tvm)).float().cpu()
    tvm.train(was_training)
    return pool_windows(cls_vectors[torch.as_tensor(window_unique)], torch.as_tensor(data.window_key),
                        len(data.keys))


def gather_keys(kr: torch.Tensor, offsets: np.ndarray, seq_index: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """KRs of some sequences, padded: -> [B, K_max, d_model], key_mask [B, K_max] bool."""
    counts = [int(offsets[i + 1] - offsets[i]) for i in seq_index]
    K = max(max(counts), 1)
    out = torch.zeros(len(seq_index), K, kr.size(1), dtype=kr.dtype)
    mask = torch.zeros(len(seq_index), K, dtype=torch.bool)
    for b, (i, n) in enumerate(zip(seq_index, counts)):
        out[b, :n] = kr[offsets[i]: offsets[i] + n]
        mask[b, :n] = True
    return out, mask


@torch.no_grad()
def ka_probabilities(
    ka: KeyAggregator, kr: torch.Tensor, data: TokenizedSequences, batch_size: int = 256,
) -> np.ndarray:
    """Class probabilities of every sequence of ``data`` given its KRs (on the CPU, as cached):
    [n_sequences, n_classes], computed where the KA is."""
    was_training = ka.training
    ka.eval()
    offsets = data.key_rows_of()
    probs = []
    for start in range(0, data.n_sequences, batch_size):
        idx = np.arange(start, min(start + batch_size, data.n_sequences))
        reprs, mask = gather_keys(kr, offsets, idx)
        probs.append(ka(*to_model((reprs, mask, ka.head_input(data, idx)), ka)).float().softmax(-1).cpu())
    ka.train(was_training)
    return torch.cat(probs).numpy() if probs else np.zeros((0, ka.config.n_classes))


def predict_proba(model: TVMKA, data: TokenizedSequences, pad_id: int, progress: bool = True) -> np.ndarray:
    """End-to-end inference: windows -> KRs -> KA -> [n_sequences, n_classes] probabilities."""
    kr = key_representations(model.tvm, data, pad_id, progress=progress)
    return ka_probabilities(model.ka, kr, data)
