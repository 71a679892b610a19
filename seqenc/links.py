"""Value links: does a value of S(k) also occur under another key of the same sequence?

S(k) shows the TVM one key at a time, so a relation *between* keys is invisible to it. In logs
the commonest such relation is identity: the data node that receives a block (``dest``) is the
one the name node records (``datanode``) and the one a replica is received from (``src_ip``).
A value that breaks it (a replica "received from" a node outside the block's pipeline) is an
ordinary value of its key, so neither S(src_ip) nor S(dest) alone can show it, and one KR per
key cannot show the KA which values two keys share. Invariant mining over log parameters (Lou
et al., "Mining Invariants from Console Logs", USENIX ATC 2010) rests on the same relation.

With ``TVMKAConfig.value_links`` on, the tokenizer puts one marker token before every value of
S(k) (seqenc.tokenizer.ValueTokenizer.encode_values)::

    S(src_ip) = [CLS] src_ip [VAL_SEP] [LINKED] 10 . 250 . 5 . 188 [VAL_SEP] [ALONE] 10 . 251 ...

``[LINKED]``: the value also occurs under at least one other key of the same sequence;
``[ALONE]``: it does not. The relation then lies inside one S(k), as a token the TVM reads
and MLM predicts.

Choices (the TVM-KA paper has no cross-key relation below the KA):

* identity of a value: its text without a leading ``/``; a ``host:port`` value (IPv4 address
  or host name, then 1-5 digits) also counts as its host, so ``10.1.2.3:50010`` (a ``dest``)
  and ``10.1.2.3`` (a ``src_ip``) link. Two values link when they share an identity;
* every value gets a marker, also in keys that never link (their markers are all ``[ALONE]``,
  which the model learns as the key's normal);
* the links are computed from the value sequences themselves (:func:`value_link_flags`), so
  training, batch scoring and the pyfunc mark values the same way with no extra input; the
  marker tokens live in ``tokenizer.json`` and their presence switches the marking on.
* the flattened and record-view baselines (seqenc.baselines) mark each object's values the
  same way (:func:`link_flags` on the long-form objects), so a comparison gives every model the
  same information.

Measured on ``value_anomaly`` (``seqenc bench accuracy --datasets value_anomaly --seeds 0,1,2
--config '{"model": {"value_links": true, "numeric_bins": 16}}'``, interleaved): test F1
0.559 +- 0.170 (0.557 / 0.730 / 0.390), against 0.385 +- 0.110 with neither option. The markers
put every ``foreign_node`` anomaly inside one S(k) (a linear probe on KR(src_ip) separates
S(src_ip) with an ``[ALONE]`` perfectly), yet the KA, from about 20 labelled examples, found
only 1 of 15 such test blocks; read through the TVM's surprise at the marker
(seqenc.surprise) 14 of 15 were found. Off by default: it changes S(k) for every dataset, and
only value_anomaly has been measured with it.

Value repeats (``TVMKAConfig.value_repeats``) are the same idea within one key: ``[SEEN]`` before
a value equal to an earlier value of S(k), ``[NEW]`` before the others::

    S(size) = [CLS] size [VAL_SEP] [NEW] 411 841 61 [VAL_SEP] [SEEN] 411 841 61 [VAL_SEP] [NEW] 671 088 64

The three replicas of an HDFS block report one size, so S(size) normally holds one ``[NEW]``;
a replica reporting another size adds a second one. Comparing two many-piece numbers is what
a small TVM fails to learn by masked-LM (measured on value_anomaly: the NLL of a masked random
size, summed over its pieces, stayed about 28 nats with five copies of it in view, with token
or whole-value masking alike); one marker token puts the comparison in the sequence.
Measured before the protocol of docs/benchmarks.md (value_anomaly, test splits of seeds 0-2, which
also chose the settings; with links, 16 bins and surprise scoring; docs/training.md):
test F1 0.817 +- 0.039 with repeats, 0.753 without (the same surprise scorer, before its
second standardisation, rescoring the earlier runs). The gain is precision: 2 false positives in ~810 normal test blocks instead of
16, at the same recall (63 and 64 of 90). That scorer did not flag a size mismatch (0/24): the
masked ``[NEW]``'s NLL there (3-7 nats) overlapped the noise of the normal blocks' markers (up to
~3.7 nats). The current scorer gives the repeat marker a statistic of its own, scored by its
normal tail, and its masked LM reads normal sequences only: 18/24 size mismatches over the
three seeds with whole-value masking, test F1 0.944 +- 0.026 (seqenc.surprise). Under the
protocol (chosen on dev of seeds 0-2, reported on the test splits of seeds 10-14): 0.937 +- 0.059.
Choices: identity within a key is the exact text; with both options a value's link marker
comes first, then its repeat marker (seqenc.tokenizer.ValueTokenizer.encode_keyed).
"""

from __future__ import annotations

import polars as pl

LINKED, ALONE = "[LINKED]", "[ALONE]"
LINK_TOKENS = (LINKED, ALONE)
SEEN, NEW = "[SEEN]", "[NEW]"
REPEAT_TOKENS = (SEEN, NEW)
_HOST_PORT = r"^([A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?):\d{1,5}$"


def link_flags(objects: pl.DataFrame) -> pl.Series:
    """Long-form rows (``sequence_id``, ``key``, ``value``) -> a boolean Series, one per row:
    whether the row's value shares an identity (module docstring) with a value of another key
    of the same sequence."""
    text = pl.col("value").cast(pl.String).fill_null("").str.strip_prefix("/")
    rows = objects.select("sequence_id", "key", "value").with_row_index("_pos")
    ids = (rows.select("_pos", "sequence_id", "key",
                       pl.concat_list(text, text.str.extract(_HOST_PORT, 1)).alias("_id"))
           .explode("_id").drop_nulls("_id").filter(pl.col("_id") != ""))
    keys_per_id = ids.group_by("sequence_id", "_id").agg(pl.col("key").n_unique().alias("_keys"))
    linked = (ids.join(keys_per_id, on=["sequence_id", "_id"])
              .group_by("_pos").agg((pl.col("_keys").max() >= 2).alias("linked")))
    return (rows.join(linked, on="_pos", how="left").sort("_pos")["linked"]
            .fill_null(False).alias("linked"))


def repeat_flags(values: list[str]) -> list[bool]:
    """Whether each value equals an earlier value of the same list (one S(k), in time order)."""
    seen: set[str] = set()
    out = []
    for v in values:
        out.append(v in seen)
        seen.add(v)
    return out


def long_repeat_flags(objects: pl.DataFrame) -> pl.Series:
    """:func:`repeat_flags` for long-form rows (``sequence_id``, ``key``, ``value``) in time
    order: whether the row's value occurred earlier under the same key of the same sequence."""
    return objects.select((~pl.col("value").cast(pl.String).fill_null("").is_first_distinct()
                           .over("sequence_id", "key")).alias("seen"))["seen"]


def value_link_flags(value_sequences: pl.DataFrame) -> list[list[bool]]:
    """:func:`link_flags` for value sequences (``sequence_id``, ``key``, ``values``): one flag
    per value, nested as the ``values`` column."""
    if value_sequences.height == 0:
        return []
    long = (value_sequences.select("sequence_id", "key", "values").with_row_index("_row")
            .explode("values").rename({"values": "value"}))
    return (long.with_columns(link_flags(long)).group_by("_row", maintain_order=True)
            .agg("linked")["linked"].to_list())
