"""The TVM-KA encoder (Murthy et al., "(Semi)-Structured Object Sequence Encoders").

Chain, as in BERT: Embeddings -> Layer (self-attention + feed-forward) -> Encoder -> networks:

* :class:`TemporalValueModeler` (TVM): BERT-style encoder over one value sequence
  S(k) = [CLS] k [VAL_SEP] v1 [VAL_SEP] v2 ...; KR(k) is its output at position 0 (Eq. 3). It
  carries a masked-LM head for pre-training and is the network DropHead applies to.
* :class:`KeyAggregator` (KA): the same architecture without positional embeddings (it reads a
  *set*); its input is a learned [CLS] vector followed by the KR(k) of every key of a sequence
  (Eq. 4); a task head reads the [CLS] output.
* :class:`TVMKA`: builds both from one config and hands the same :class:`SharedHeadProjections`
  of each layer to both, so heads 1..p are literally the same parameters.
* Task heads live in seqenc.heads (classification; next-item retrieval with ``top_k``); the
  pre-trained BERT init in seqenc.pretrained; the paper's baselines in seqenc.baselines.
* :class:`SaveLoadMixin` gives every model ``save_pretrained`` / ``from_pretrained`` (a
  directory: config.json + model.safetensors + architecture.json).

Choices where the paper is silent (documented here, see also seqenc.attention):
* Post-LayerNorm BERT layers (as BERT, so a BERT checkpoint can initialise the TVM).
* KA input: every KR(k) is first standardised feature by feature with the mean and standard
  deviation of the training KRs (buffers ``kr_mean``/``kr_std``, refitted at every KR-cache
  refresh and saved with the model). The [CLS] output of an MLM-trained encoder is dominated by
  a component common to all keys (MLM never trains position 0), so the differences between
  sequences are small in absolute terms; standardising brings them to unit scale. Then
  [CLS; KR(k1); ...; KR(kn)] goes through LayerNorm and dropout (the KA's "embedding" layer);
  no key-identity embedding is added because S(k) already starts with k.
* Windows of one long S(k) are encoded as a batch and KR(k) is the mean of their [CLS] outputs
  (:func:`pool_windows`); a parameter-free pooling keeps KR(k) for a short key identical to
  the single-window output.
* The MLM decoder is tied to the word embeddings, as in BERT.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_file
from torch import nn

from seqenc.attention import SelfAttention, SharedHeadProjections, additive_mask
from seqenc.config import TVMKAConfig
from seqenc.ema import LowDimEMA
from seqenc.fixup import prepare_key_aggregator
from seqenc.heads import make_head

if TYPE_CHECKING:
    import numpy as np

    from seqenc.sequences import TokenizedSequences

log = logging.getLogger(__name__)

ACTIVATIONS = {
    "gelu": nn.GELU,  # exact (erf) GELU, BERT's "gelu"
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # BERT's "gelu_new" / "gelu_pytorch_tanh"
    "relu": nn.ReLU,
}


class Embeddings(nn.Module):
    """Token (+ position) (+ token type) embeddings, then LayerNorm and dropout.

    Token types default to 0 everywhere (S(k) has one segment); the flattened baseline marks
    key tokens 0 and value tokens 1.
    """

    def __init__(self, config: TVMKAConfig, positional: bool = True, within_value: bool = False):
        super().__init__()
        # what a position counts: the index in the row, or (within_value, the TVM under
        # config.tvm_positions="within_value") the offset from the last [VAL_SEP], whose id this is
        self.restart_id = config.val_sep_token_id if positional and within_value else None
        self.word = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_positions, config.d_model) if positional else None
        self.token_type = nn.Embedding(config.type_vocab_size, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                extra: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids: [B, L] (token_type_ids: [B, L] or None; extra: [B, L, d_model] added before
        # the LayerNorm, e.g. MAFiD's exact-match embeddings) -> [B, L, d_model]
        L = input_ids.size(1)
        types = self.token_type.weight[0] if token_type_ids is None else self.token_type(token_type_ids)
        x = self.word(input_ids) + types
        if extra is not None:
            x = x + extra
        if self.position is not None:
            index = torch.arange(L, device=input_ids.device)  # [L]
            if self.restart_id is not None:
                # offset from the last [VAL_SEP] at or before each token: [CLS] 0, key 1.., [VAL_SEP] 0, value 1..
                last_sep = torch.where(input_ids == self.restart_id, index, 0).cummax(dim=1).values  # [B, L]
                x = x + self.position(index - last_sep)
            else:
                x = x + self.position(index)
        return self.dropout(self.norm(x))


class Layer(nn.Module):
    """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)). ``norm=False`` drops
    both LayerNorms (DT-Fixup's layers on top of a pre-trained encoder, seqenc.fixup)."""

    def __init__(self, config: TVMKAConfig, shared: SharedHeadProjections | None, drophead: float,
                 norm: bool = True):
        super().__init__()
        layer_norm = (lambda: nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)) if norm else nn.Identity
        self.attn = SelfAttention(config, shared, drophead)
        self.attn_norm = layer_norm()
        self.ffn_in = nn.Linear(config.d_model, config.d_ff)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.ffn_out = nn.Linear(config.d_ff, config.d_model)
        self.ffn_norm = layer_norm()
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, attend=None) -> torch.Tensor:
        x = self.attn_norm(x + self.dropout(self.attn(x, bias, attend)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class EMALayer(nn.Module):
    """A Layer with MAFiD's low-dimensional EMA (seqenc.ema) in place of self-attention:
    x = LN(x + EMA(x)); x = LN(x + FFN(x)). Linear in the length; reads positions in order."""

    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.mix = LowDimEMA(config.d_model, config.mafid_reduction)
        self.mix_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.d_model, config.d_ff)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.ffn_out = nn.Linear(config.d_ff, config.d_model)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.mix_norm(x + self.dropout(self.mix(x, mask)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))


class EMAEncoder(nn.Module):
    """``n_layers`` EMALayers over x [B, L, d] with mask [B, L] bool (the KA's ``ka_mixer="ema"``)."""

    def __init__(self, config: TVMKAConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EMALayer(config) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, attention_mask)
        return x


class Encoder(nn.Module):
    """``n_layers`` layers (default: the config's); layer i shares ``shared[i]`` where there is one."""

    def __init__(self, config: TVMKAConfig, shared: nn.ModuleList | None, drophead: float,
                 n_layers: int | None = None, norm: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(
            Layer(config, shared[i] if shared is not None and i < len(shared) else None, drophead, norm)
            for i in range(n_layers if n_layers is not None else config.n_layers)
        )

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        bias = additive_mask(attention_mask, x.dtype)  # the one bool -> additive conversion
        for layer in self.layers:
            x = layer(x, bias)
        return x


def init_weights(module: nn.Module, std: float) -> None:
    """BERT-style initialisation: N(0, std) weights, zero biases, LayerNorm weight 1 / bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class TemporalValueModeler(nn.Module):
    """BERT-style encoder over S(k); ``forward`` returns hidden states, KR(k) = position 0."""

    def __init__(self, config: TVMKAConfig, shared: nn.ModuleList | None):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config, positional=True, within_value=config.tvm_positions == "within_value")
        self.encoder = Encoder(config, shared, drophead=config.drophead)
        # masked-LM head: dense -> act -> LayerNorm -> decoder tied to the word embeddings
        self.mlm_dense = nn.Linear(config.d_model, config.d_model)
        self.mlm_act = ACTIVATIONS[config.hidden_act]()
        self.mlm_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        # replaced-value detection at every position, [CLS] for the row (config.replaced_value_detection)
        self.rvd_head = nn.Linear(config.d_model, 1) if config.replaced_value_detection else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # [B, L] ids, [B, L] bool -> [B, L, d_model]
        return self.encoder(self.embeddings(input_ids), attention_mask)

    def key_representations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L] -> [B, d_model]: the output at position 0 ([CLS]) of each row."""
        return self(input_ids, attention_mask)[:, 0]

    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # [..., d_model] -> [..., vocab_size]
        h = self.mlm_norm(self.mlm_act(self.mlm_dense(hidden)))
        return h @ self.embeddings.word.weight.T + self.mlm_bias

    def mlm_loss(self, input_ids, attention_mask, labels, replaced: torch.Tensor | None = None):
        """Cross-entropy on positions whose label is not -100 (only those are decoded).

        With ``replaced`` ([B, L] bool, training.tasks.data.MLMBatches: at [CLS] "a value of this row
        was swapped", elsewhere "this token is part of the swapped value") returns ``(mlm,
        rvd)``: the MLM loss and the RVD head's binary cross-entropy, the mean over the [CLS]
        positions plus the mean over all other real positions (equal weights: KR(k) is the [CLS]
        output, so its answer counts as much as all the tokens'). One forward pass serves both."""
        hidden = self(input_ids, attention_mask)
        picked = labels != -100
        mlm = F.cross_entropy(self.mlm_logits(hidden[picked]), labels[picked]) if picked.any() \
            else hidden.sum() * 0.0
        if replaced is None:
            return mlm
        if self.rvd_head is None:
            raise ValueError("replaced-value labels given, but config.replaced_value_detection is off")
        logits = self.rvd_head(hidden).squeeze(-1)  # [B, L]
        target = replaced.float()
        cls = F.binary_cross_entropy_with_logits(logits[:, 0], target[:, 0])
        tokens = attention_mask.clone()
        tokens[:, 0] = False
        per_token = F.binary_cross_entropy_with_logits(logits[tokens], target[tokens]) if tokens.any() else cls * 0.0
        return mlm, cls + per_token


def pool_windows(cls_vectors: torch.Tensor, owner: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Mean of the window [CLS] vectors of each key: [W, d], owner [W] in [0, n_keys) -> [n_keys, d]."""
    sums = torch.zeros(n_keys, cls_vectors.size(1), dtype=cls_vectors.dtype, device=cls_vectors.device)
    sums.index_add_(0, owner, cls_vectors)
    counts = torch.bincount(owner, minlength=n_keys).clamp(min=1).to(cls_vectors.dtype)
    return sums / counts[:, None]


class KeyAggregator(nn.Module):
    """Set encoder over [CLS; KR(k)...] (no positions) with a task head (seqenc.heads)."""

    def __init__(self, config: TVMKAConfig, shared: nn.ModuleList | None):
        super().__init__()
        self.config = config
        self.cls = nn.Parameter(torch.zeros(config.d_model))
        self.register_buffer("kr_mean", torch.zeros(config.d_model))
        self.register_buffer("kr_std", torch.ones(config.d_model))
        # DT-Fixup's measured input norm mu (seqenc.fixup); 0 until the scaling is applied
        self.register_buffer("fixup_mu", torch.zeros(()))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        # DropHead is TVM-only; DT-Fixup's layers have no LayerNorm; EMA layers share no heads
        self.encoder = EMAEncoder(config, config.ka_depth) if config.ka_mixer == "ema" else \
            Encoder(config, shared, drophead=0.0, n_layers=config.ka_depth, norm=config.ka_init != "dt_fixup")
        self.head = make_head(config)

    def inputs(self, key_reprs: torch.Tensor, key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # key_reprs: [B, K, d_model], key_mask: [B, K] bool -> the first layer's input [B, 1 + K,
        # d_model] ([CLS; standardised KRs], normalised) and its mask [B, 1 + K]
        B = key_reprs.size(0)
        key_reprs = (key_reprs - self.kr_mean) / self.kr_std
        x = torch.cat([self.cls.expand(B, 1, -1), key_reprs], dim=1)  # [B, 1 + K, d_model]
        mask = torch.cat([key_mask.new_ones(B, 1), key_mask], dim=1)
        return self.dropout(self.norm(x)), mask

    def encode(self, key_reprs: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        # key_reprs: [B, K, d_model], key_mask: [B, K] bool -> [B, d_model] sequence embedding
        return self.encoder(*self.inputs(key_reprs, key_mask))[:, 0]

    @torch.no_grad()
    def fit_kr_standardisation(self, kr: torch.Tensor) -> None:
        """Set kr_mean/kr_std from training KRs [n, d_model] (std floored at 1e-6)."""
        self.kr_mean.copy_(kr.mean(0))
        self.kr_std.copy_(kr.std(0).clamp(min=1e-6))

    def head_input(self, data: TokenizedSequences, sequence_index: np.ndarray):
        """What the head reads beside the sequence embedding, for some sequences of ``data``: the
        item history (``config.item_history``), the bag of values (``config.value_counts``), or
        None (seqenc.heads)."""
        if self.config.item_history:
            return data.history_features(sequence_index, self.config.n_items)
        if self.config.value_counts:
            return data.value_count_bags(sequence_index, self.config.value_counts, self.config.val_sep_token_id)
        return None

    def forward(self, key_reprs: torch.Tensor, key_mask: torch.Tensor, head_input=None) -> torch.Tensor:
        # -> [B, n_outputs] logits / item scores; head_input: what head_input() returns for the batch
        return self.head(self.encode(key_reprs, key_mask), head_input)

    @torch.no_grad()
    def top_k(self, key_reprs: torch.Tensor, key_mask: torch.Tensor, k: int = 10,
              history: torch.Tensor | None = None):
        """Next-item retrieval: (scores [B, k], item ids [B, k]) of the best catalogue items."""
        if self.config.task != "next_item":
            raise ValueError(f"top_k needs task='next_item', this KA does {self.config.task!r}")
        return self.head.top_k(self.encode(key_reprs, key_mask), k, history=history)



def _unique_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One copy of every distinct tensor of a state dict, under the name safetensors' own
    ``load_model`` expects (the alphabetically first of the names that hold it: the TVM-KA shared
    heads are one Parameter under a ``tvm.`` and a ``ka.`` name).

    Not ``safetensors.torch.save_model``: it groups tensors by *storage*, and under DeepSpeed ZeRO
    every parameter is a view into one flat buffer, so it saw a single giant group and refused.
    Here a tensor is the same tensor when it is the same view (address, shape, strides, dtype)."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype) if tensor.numel() \
            else (name,)  # empty tensors have no address to compare
        groups.setdefault(key, []).append(name)
    return {min(names): state[min(names)].detach().cpu().contiguous().clone() for names in groups.values()}


def read_architecture(directory: str | Path) -> dict:
    """``architecture.json`` of a saved model: ``{"class": name, "options": {...}}``; an error
    naming the file when it is missing or not of that form."""
    path = Path(directory) / "architecture.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the directory does not say which model it holds")
    try:
        arch = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(arch, dict) or not isinstance(arch.get("class"), str) \
            or not isinstance(arch.get("options", {}), dict):
        raise ValueError(f"{path} must be a JSON object with a string 'class' and an object 'options'")
    return {"class": arch["class"], "options": arch.get("options", {})}


class SaveLoadMixin:
    """Hugging Face style persistence for every model of the package: a directory with
    ``config.json`` (the model's config: ``config_class``), ``model.safetensors``, ``architecture.json`` (class name
    and constructor options, checked on load) and optional ``metadata.json``. Nothing pickled.
    Subclasses take ``(config, **init_options())`` in their constructor."""

    config: TVMKAConfig
    config_class: type[TVMKAConfig] = TVMKAConfig  # the family's config class (the table encoders': TableConfig)

    def init_options(self) -> dict:
        return {}

    def save_pretrained(self, directory: str | Path, extra: dict | None = None) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save(directory / "config.json")
        arch = {"class": type(self).__name__, "options": self.init_options()}
        (directory / "architecture.json").write_text(json.dumps(arch, indent=2))
        save_file(_unique_tensors(self.state_dict()), str(directory / "model.safetensors"), metadata={"format": "pt"})
        if extra:
            (directory / "metadata.json").write_text(json.dumps(extra, indent=2, sort_keys=True))
        return directory

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str = "cpu"):
        """Load a model of this class (seqenc.baselines.load_pretrained loads whichever class
        the directory holds)."""
        directory = Path(directory)
        options = {}
        if (directory / "architecture.json").is_file():
            arch = read_architecture(directory)
            if arch["class"] != cls.__name__:
                raise ValueError(f"{directory} holds a {arch['class']}, not a {cls.__name__}")
            options = arch["options"]
        model = cls(cls.config_class.load(directory / "config.json"), **options)
        missing, unexpected = load_model(model, str(directory / "model.safetensors"), device=map_location)
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing={missing}, unexpected={unexpected}")
        return model


class TVMKA(SaveLoadMixin, nn.Module):
    """TVM and KA built from one config, sharing the Q/K/V weights of p heads per layer."""

    def __init__(self, config: TVMKAConfig):
        super().__init__()
        self.config = config
        shared = (
            nn.ModuleList(SharedHeadProjections(config) for _ in range(config.n_layers))
            if config.n_shared_heads > 0 else None
        )
        self.tvm = TemporalValueModeler(config, shared)
        self.ka = KeyAggregator(config, shared)
        init_weights(self, config.init_std)
        if config.ka_init == "dt_fixup":  # Xavier on the KA's own layers, a random [CLS]; the scaling waits for mu
            prepare_key_aggregator(self.ka)

    def shared_parameters(self) -> list[nn.Parameter]:
        return [p for n, p in self.tvm.named_parameters() if ".attn.shared." in n]
