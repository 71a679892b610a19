"""WordPiece tokenizer for keys and values (Hugging Face ``tokenizers``).

Two ways to get one:
* :meth:`ValueTokenizer.train` learns a WordPiece vocabulary from the corpus's keys and values
  (BERT normalisation: lower-case, accents stripped; BERT pre-tokenisation: split on
  whitespace and punctuation, so ``10.250.19.102:50010`` becomes ``10 . 250 . 19 . 102 : 50010``);
* :meth:`ValueTokenizer.from_file` loads a ``tokenizer.json`` and adds the special tokens it
  lacks; :meth:`ValueTokenizer.from_bert` takes a pre-trained BERT vocabulary (``"minilm"`` =
  the bundled MiniLM, see seqenc.pretrained). Choice: [VAL_SEP] is *appended* after BERT's
  30,522 tokens (id 30,522) rather than renaming an ``[unusedN]`` slot, so any BERT vocabulary
  works; seqenc.pretrained gives its embedding row the mean embedding.

Any truncation or padding configured in a loaded ``tokenizer.json`` (sentence-transformers
ships ``max_length`` 128-256) is switched off: a value must never be cut silently; windowing
(seqenc.sequences) decides what fits.

Values repeat a lot in logs (the same template, the same ports), so :meth:`encode_many`
tokenises each distinct string once.

Numbers: :meth:`with_numeric_bins` adds per-key quantile-bin tokens (seqenc.numeric);
:meth:`encode_values` then puts a key's bin token before each numeric value. The bins are saved
as ``numeric_bins.json`` beside ``tokenizer.json`` and loaded with it.

Value links: :meth:`with_value_links` adds the ``[LINKED]`` / ``[ALONE]`` markers
(seqenc.links); :meth:`encode_values` given the link flags puts one before each value. The
markers are saved in ``tokenizer.json``; a tokenizer that holds them marks values
(:attr:`value_links`).

Choice (reproducibility): a trained vocabulary has no ``##`` continuation prefix -- a piece
inside a word is the same token as at its start (``123456789`` -> ``123 456 789``). With the
prefix, ``tokenizers``' WordPiece trainer creates the ``##`` pieces in hash-map order, and on
tied pair counts that order picks the merges, so two runs on the same corpus gave different
vocabularies (huggingface/tokenizers#1794; measured here: 3 runs, 3 vocabularies). Without
it every id comes from the sorted alphabet and the merges, and the same corpus always gives
the same vocabulary and ids -- a seeded run is repeatable end to end. A BERT vocabulary
(:meth:`from_bert`) keeps its own ``##`` pieces.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from seqenc.bert_files import resolve_bert_dir
from seqenc.links import LINK_TOKENS, REPEAT_TOKENS
from seqenc.numeric import NumericBins

PAD, UNK, CLS, SEP, MASK, VAL_SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[VAL_SEP]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK, VAL_SEP]
END = "[END]"  # the last value of every S(k) with value ends on (TVMKAConfig.value_end)
NUMERIC_BINS_FILE = "numeric_bins.json"  # beside tokenizer.json
# distinct value texts whose token ids encode_many remembers. A/B on the windows step of the
# first 40 buckets of a week-scale HDFS build (800k sequences; seqenc bench sequences' data):
# peak RSS 1,921 MB with 1M entries, 1,625 MB with 200k, the same windows, seconds within noise
# (values that recur across buckets are encoded again after a clear: a cheap WordPiece pass).
CACHE_LIMIT = 200_000


class ValueTokenizer:
    def __init__(self, tokenizer: Tokenizer):
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            tokenizer.add_special_tokens(missing)
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.tokenizer = tokenizer
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id, self.val_sep_id = (
            tokenizer.token_to_id(t) for t in SPECIAL_TOKENS
        )
        self.special_ids = frozenset(tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
        self._cache: dict[str, list[int]] = {}
        self._words: dict[str, list[int]] = {}  # per cached text: each token's word index (encode_words)
        self.numeric: NumericBins | None = None
        self._bin_ids: list[int] = []
        # marker pairs (seqenc.links): present in a saved vocabulary -> marking is on
        self._link_ids = self._marker_pair(LINK_TOKENS)
        self._repeat_ids = self._marker_pair(REPEAT_TOKENS)
        self.end_id: int | None = tokenizer.token_to_id(END)

    def _marker_pair(self, tokens: tuple[str, str], add: bool = False) -> tuple[int, int] | None:
        """The ids of a marker pair, added to the vocabulary first with ``add``; None if absent.
        Added unsplittable, but not in ``special_ids``: MLM masks and predicts them."""
        if add:
            self.tokenizer.add_special_tokens(list(tokens))
        ids = tuple(self.tokenizer.token_to_id(t) for t in tokens)
        return None if None in ids else ids

    def with_numeric_bins(self, bins: NumericBins | None) -> ValueTokenizer:
        """Use ``bins`` in :meth:`encode_values`; their tokens join the vocabulary (at its end,
        unsplittable; not in ``special_ids``, so MLM masks and predicts them). Returns self."""
        self.numeric = bins
        if bins is not None:
            self.tokenizer.add_special_tokens(bins.tokens)
            self._bin_ids = [self.tokenizer.token_to_id(t) for t in bins.tokens]
        return self

    def with_value_links(self) -> ValueTokenizer:
        """Add the value-link markers (seqenc.links) to the vocabulary, unsplittable and
        maskable like the bin tokens; :attr:`value_links` is then True. Returns self."""
        self._link_ids = self._marker_pair(LINK_TOKENS, add=True)
        return self

    @property
    def value_links(self) -> bool:
        """Whether this tokenizer marks values as linked / alone (seqenc.links)."""
        return self._link_ids is not None

    def with_value_repeats(self) -> ValueTokenizer:
        """Add the repeat markers ``[SEEN]`` / ``[NEW]`` (seqenc.links) as :meth:`with_value_links`
        adds the link markers; :attr:`value_repeats` is then True. Returns self."""
        self._repeat_ids = self._marker_pair(REPEAT_TOKENS, add=True)
        return self

    @property
    def value_repeats(self) -> bool:
        """Whether this tokenizer marks values as seen before in S(k) / new (seqenc.links)."""
        return self._repeat_ids is not None

    def with_value_end(self) -> ValueTokenizer:
        """Add ``[END]``, the value that closes every S(k) (TVMKAConfig.value_end), unsplittable
        and maskable like the markers; :attr:`value_end` is then True. Returns self."""
        self.tokenizer.add_special_tokens([END])
        self.end_id = self.tokenizer.token_to_id(END)
        return self

    @property
    def value_end(self) -> bool:
        """Whether every S(k) this tokenizer builds ends with the value ``[END]``."""
        return self.end_id is not None

    @property
    def marker_kinds(self) -> dict[str, frozenset[int]]:
        """The ids of the tokens that may lead a value, by kind: ``link`` and ``repeat`` markers
        (seqenc.links) and ``bin`` tokens (seqenc.numeric); a kind that is off has none."""
        return {"link": frozenset(self._link_ids or ()), "repeat": frozenset(self._repeat_ids or ()),
                "bin": frozenset(self._bin_ids)}

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def train(cls, texts: Iterable[str] | Iterable[list[str]], vocab_size: int = 8192,
              min_frequency: int = 2) -> ValueTokenizer:
        """A WordPiece vocabulary from ``texts`` (strings, or lists of strings: batches)."""
        # no "##" prefix: deterministic training (module docstring); the decoder, which joins
        # only "##" pieces, then puts a space between every two tokens
        tok = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix=""))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
            show_progress=False, continuing_subword_prefix="",
        )
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> ValueTokenizer:
        """A saved tokenizer, with its numeric bins when ``numeric_bins.json`` lies beside it."""
        bins_path = Path(path).with_name(NUMERIC_BINS_FILE)
        return cls(Tokenizer.from_file(str(path))).with_numeric_bins(
            NumericBins.load(bins_path) if bins_path.is_file() else None)

    @classmethod
    def from_bert(cls, name_or_path: str | Path = "minilm") -> ValueTokenizer:
        """The WordPiece vocabulary of a BERT checkpoint directory, plus [VAL_SEP]."""
        directory = resolve_bert_dir(name_or_path)
        if (directory / "tokenizer.json").is_file():
            return cls.from_file(directory / "tokenizer.json")
        if (directory / "vocab.txt").is_file():
            tok = Tokenizer(models.WordPiece.from_file(str(directory / "vocab.txt"), unk_token=UNK))
            tok.normalizer = normalizers.BertNormalizer(lowercase=True)
            tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tok.decoder = decoders.WordPiece()
            return cls(tok)
        raise FileNotFoundError(f"{directory} has neither tokenizer.json nor vocab.txt")

    def save(self, path: str | Path) -> None:
        """``tokenizer.json`` at ``path``, and the numeric bins beside it (a stale file is removed)."""
        self.tokenizer.save(str(path))
        bins_path = Path(path).with_name(NUMERIC_BINS_FILE)
        if self.numeric is not None:
            self.numeric.save(bins_path)
        else:
            bins_path.unlink(missing_ok=True)

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """Token ids (no special tokens) of each text; each distinct text is tokenised once (a
        cache of at most ``CACHE_LIMIT`` texts -- or one call's, when a call alone passes it --
        emptied when a call would pass the limit)."""
        new = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if len(self._cache) + len(new) > CACHE_LIMIT:
            self._cache.clear()
            self._words.clear()
            new = list(dict.fromkeys(texts))
        if new:
            for text, enc in zip(new, self.tokenizer.encode_batch(new, add_special_tokens=False)):
                self._cache[text] = enc.ids
                self._words[text] = enc.word_ids
        return [self._cache[t] for t in texts]

    def encode_words(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, ...]]]]:
        """Per text: its token ids (as :meth:`encode_many`) and, per token, the word it belongs to
        as the tuple of that word's token ids. A word is a pre-token (BERT's: split on whitespace
        and punctuation, after lower-casing), so two texts share a word exactly when they share
        that tuple -- the exact-match features of seqenc.table_inputs compare words this way."""
        out = []
        for text, ids in zip(texts, self.encode_many(texts)):
            # an added token (a marker, a bin) may have no word: it is a word of its own
            word_of = [w if w is not None else -1 - j for j, w in enumerate(self._words[text])]
            words: dict[int, list[int]] = {}
            for i, w in zip(ids, word_of):
                words.setdefault(w, []).append(i)
            out.append((ids, [tuple(words[w]) for w in word_of]))
        return out

    def encode_values(self, key: str, values: list[str], linked: list[bool] | None = None,
                      seen: list[bool] | None = None) -> list[list[int]]:
        """Token ids of each value of ``key`` (bin, repeat and link tokens as in :meth:`encode_keyed`)."""
        return self.encode_keyed([key] * len(values), values, linked, seen)

    def encode_keyed(self, keys: list[str], values: list[str], linked: list[bool] | None = None,
                     seen: list[bool] | None = None) -> list[list[int]]:
        """Token ids of each value, ``values[i]`` being a value of ``keys[i]``: a numeric value
        led by its bin token; with ``seen`` (one flag per value, seqenc.links) every value led by
        ``[SEEN]`` or ``[NEW]`` before that; with ``linked`` by ``[LINKED]`` or ``[ALONE]`` first."""
        ids = self.encode_many(values)
        if self.numeric is not None:
            bins = map(self.numeric.bin_of, keys, values)
            ids = [v if b is None else [self._bin_ids[b], *v] for v, b in zip(ids, bins)]
        ids = self._lead(ids, seen, self._repeat_ids, "repeat", "with_value_repeats")
        return self._lead(ids, linked, self._link_ids, "link", "with_value_links")

    @staticmethod
    def _lead(ids: list[list[int]], flags: list[bool] | None, markers: tuple[int, int] | None, what: str,
              method: str) -> list[list[int]]:
        """Each value's ids led by ``markers[0]`` where its flag is true, else ``markers[1]``."""
        if flags is None:
            return ids
        if markers is None:
            raise ValueError(f"{what} flags given, but this tokenizer has no value-{what} tokens ({method})")
        if len(flags) != len(ids):
            raise ValueError(f"{len(flags)} {what} flags for {len(ids)} values")
        on, off = markers
        return [[on if flag else off, *v] for v, flag in zip(ids, flags)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)
