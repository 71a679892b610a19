"""Drain3's ``Drain`` with masked values counted as parameters when comparing a line to a template.

Plain Drain3 treats a masked token such as ``<IP>`` or ``<UUID>]`` as an ordinary word: two
short messages that share only their masked ids (``[instance: <UUID>] Claim successful`` and
``[instance: <UUID>] Creating image``) look 50% similar and merge. The original Drain (He et
al. 2017, and the LogPAI benchmark code) replaces masked values by the wildcard, which its
similarity skips. :class:`MaskAwareDrain` does the same for any token holding a mask
(``<NAME>``), while the template text keeps the mask *names* (needed to name parameter keys).

``make_miner`` (parsers.logs) switches the miner's Drain instance to this class after Drain3
has built it, before the state is loaded; the state file (parsers.drain_state) holds only data,
never a class name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from drain3.drain import Drain

_MASKED = re.compile(r"<[A-Z][A-Z0-9_]*>")


class MaskAwareDrain(Drain):
    def get_seq_distance(self, seq1: Sequence[str], seq2: Sequence[str], include_params: bool) -> tuple[float, int]:
        if len(seq1) != len(seq2):
            raise ValueError("sequences of different lengths")
        if not seq1:
            return 1.0, 0
        similar = params = 0
        for token1, token2 in zip(seq1, seq2):
            if token1 == self.param_str or _MASKED.search(token1):
                params += 1
                continue
            if token1 == token2:
                similar += 1
        if include_params:
            similar += params
        return similar / len(seq1), params
