"""Drain3's ``Drain`` with masked values counted as parameters when comparing a line to a template.

Plain Drain3 treats a masked token such as ``<IP>`` or ``<UUID>]`` as an ordinary word: two
short messages that share only their masked ids (``[instance: <UUID>] Claim successful`` and
``[instance: <UUID>] Creating image``) look 50% similar and merge. The original Drain (He et
al. 2017, and the LogPAI benchmark code) replaces masked values by the wildcard, which its
similarity skips. :class:`MaskAwareDrain` does the same for any token holding a mask
(``<NAME>``), while the template text keeps the mask *names* (needed to name parameter keys).

**Token shapes** (``shapes = True``; ``LogFormat.mask_shapes``, on for every format but the
presets, issue 49). A token that holds a mask *and* literal text (``vis=<NUM>``,
``flg=<HEX>,``) is not a bare parameter: it says which field the value belongs to. With shapes:

* such a token is compared by its **shape**: its literal text with every mask and ``<*>`` as one
  wildcard. ``vis=<NUM>`` and ``vis=<HEX>`` are the same word to the similarity (LogPAI's Drain
  sees ``vis=<*>`` twice), ``vis=<NUM>`` and ``mask=<NUM>`` differ. Only a *bare* mask or
  ``<*>`` is skipped as a parameter. Without shapes, a line of eighteen ``key=<NUM>`` tokens
  could only ever join a template equal to it (Android's ``setSystemUiVisibility``: split in
  five by which of its numbers happened to be hex);
* it takes the wildcard branch of the prefix tree, as a token with digits does in Drain3, so
  the first tokens' mask names do not route look-alike lines apart;
* when two different tokens merge into a template, a mask name they do not share becomes
  ``<*>`` (``vis=<NUM>`` and ``vis=<HEX>`` give ``vis=<*>``: the slot's values are of either
  kind), and what they share at their edges up to a delimiter stays: ``rhost=<IP>`` and ``rhost=host.org`` give ``rhost=<*>``, ``(a.b.org)`` and
  ``()`` give ``(<*>)``, not ``<*>``. The template then reads as LogHub's ground truth writes
  it, and keeps matching by shape.

``make_miner`` (parsers.logs) switches the miner's Drain instance to one of these classes after
Drain3 has built it, before the state is loaded; the state file (parsers.drain_state) holds only data,
never a class name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from drain3.drain import Drain

_MASKED = re.compile(r"<[A-Z][A-Z0-9_]*>")
_SLOT = re.compile(r"<[A-Z][A-Z0-9_]*>|<\*>")
_BARE = re.compile(r"(?:<[A-Z][A-Z0-9_]*>|<\*>)+")
# the characters where a kept edge of a merged token may end (prefix) or start (suffix)
_PREFIX_ENDS = frozenset("=:([{/,;'\"@#")
_SUFFIX_STARTS = frozenset(")]}:,;'\"/")


FIT_MAX_CHARS, FIT_MAX_SLOTS = 256, 8  # beyond these a token fits a template token only by equal shape


@lru_cache(maxsize=65536)
def shape(token: str) -> str:
    """The token with every mask and ``<*>`` as ``<*>`` (``vis=<HEX>`` -> ``vis=<*>``)."""
    return _SLOT.sub("<*>", token)


@lru_cache(maxsize=65536)
def _shape_regex(token_shape: str) -> re.Pattern:
    return re.compile(".*?".join(re.escape(p) for p in token_shape.split("<*>")), re.DOTALL)


def fits(template_token: str, token: str) -> bool:
    """Whether ``token`` has the shape of ``template_token``: its literal text in place, anything
    where the template holds a mask or ``<*>`` (``rhost=<*>`` fits ``rhost=<IP>``)."""
    wanted, got = shape(template_token), shape(token)
    if wanted == got:
        return True
    if len(got) > FIT_MAX_CHARS or wanted.count("<*>") > FIT_MAX_SLOTS:  # no slow match on a huge token
        return False
    return _shape_regex(wanted).fullmatch(got) is not None


def merge_tokens(a: str, b: str) -> str:
    """The template token for two different tokens: ``<*>``, with the edges they share kept when
    a kept prefix ends with a delimiter (``=``, ``(``, ...) and a kept suffix starts with one
    (``rhost=<IP>`` + ``rhost=x.org`` -> ``rhost=<*>``)."""
    a, b = shape(a), shape(b)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    prefix = a[:n]
    while prefix and prefix[-1] not in _PREFIX_ENDS:
        prefix = prefix[:-1]
    rest_a, rest_b = a[len(prefix):], b[len(prefix):]
    m = 0
    while m < min(len(rest_a), len(rest_b)) and rest_a[-1 - m] == rest_b[-1 - m]:
        m += 1
    suffix = rest_a[len(rest_a) - m:] if m else ""
    while suffix and suffix[0] not in _SUFFIX_STARTS:
        suffix = suffix[1:]
    if "<*>" in prefix or "<*>" in suffix or "<" in prefix[-1:]:  # never cut a wildcard in two
        return "<*>"
    return f"{prefix}<*>{suffix}"


class MaskAwareDrain(Drain):
    shapes = False  # token shapes (module docstring): on in ShapeAwareDrain

    def has_numbers(self, s: str) -> bool:  # Drain3 calls it on the instance: routes to the wildcard branch
        return any(ch.isdigit() for ch in s) or (self.shapes and _MASKED.search(s) is not None)

    def get_seq_distance(self, seq1: Sequence[str], seq2: Sequence[str], include_params: bool) -> tuple[float, int]:
        if len(seq1) != len(seq2):
            raise ValueError("sequences of different lengths")
        if not seq1:
            return 1.0, 0
        similar = params = 0
        for token1, token2 in zip(seq1, seq2):
            if token1 == self.param_str or (_BARE.fullmatch(token1) if self.shapes else _MASKED.search(token1)):
                params += 1
                continue
            if token1 == token2 or (self.shapes and "<" in token1 and fits(token1, token2)):
                similar += 1
        if include_params:
            similar += params
        return similar / len(seq1), params

    def create_template(self, seq1: Sequence[str], seq2: Sequence[str]) -> list[str]:
        if not self.shapes:
            return super().create_template(seq1, seq2)
        if len(seq1) != len(seq2):
            raise ValueError("sequences of different lengths")
        out = []
        for token, kept in zip(seq1, seq2):  # seq1: the line, seq2: the template
            if token == kept:
                out.append(kept)
            elif "<" in kept and fits(kept, token):  # a mask name the line does not share becomes <*>
                out.append(kept if _MASKED.search(kept) is None else shape(kept))
            else:
                out.append(merge_tokens(token, kept))
        return out


class ShapeAwareDrain(MaskAwareDrain):
    """:class:`MaskAwareDrain` with token shapes (the module docstring); ``LogFormat.mask_shapes``."""

    shapes = True
