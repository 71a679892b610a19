"""Word splits: a template's slot that only ever holds a few words is part of the event.

Drain merges two lines that differ in one word once the rest is similar enough:
``Failed password for invalid user admin from <IP> ...`` and ``Failed none for invalid user ...``
become ``Failed <*> for invalid user <*> ...``; ``layout begin`` and ``layout end`` become
``layout <*>``. To a reader (and to LogHub's ground truth) ``password`` and ``none`` name two
events, while the user names are values. What tells them apart is how many different words a
slot takes: a few, repeated, or many.

**The rule** (``LogFormat.split_words = K``; 0 turns it off). A slot of a template -- a position
where Drain's template holds ``<*>``, alone or inside a token (``action:<*>``) -- whose values
over the source's lines are all *words* (letters and inner punctuation: no digit, no mask) and
at most ``K`` distinct ones, splits its template: each combination of such words is an event of
its own, with its own id and its template with the words written in. A slot that has held a
number, a masked value or more than ``K`` words is a value for good.

* Chosen on the twelve shared LogHub systems, leave-one-system-out (docs/data-layout.md,
  training.bench.parse): ``K`` = 3. It reads only the source's own lines, never a ground truth.
* When: after a batch of lines (one file in ingest, the 2,000 lines of a bench set), on the words
  seen so far by the source (kept in its Drain3 state, parsers.drain_state). Decided per batch, so a
  file's lines get one consistent answer; a slot that passes ``K`` words in a later file is a value
  from then on (the earlier files' parts keep their events, as they keep their template text).
* Event ids come from Drain's own counter, so they never collide with a template's id; an
  unsplit template's lines keep the template's id.
* Memory: per template, the distinct words of each position, dropped at ``K + 1``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

WORD = re.compile(r"[^\W\d]+(?:[^\w\s<>]+[^\W\d]+)*[^\w\s<>]?")  # letters, inner punctuation; no digit, no mask


def is_word(token: str) -> bool:
    return WORD.fullmatch(token) is not None


class WordSplit:
    """The words each template position has held (``words``) and the events made of them
    (``events``: (template id, words) -> event id)."""

    def __init__(self, max_words: int) -> None:
        if not isinstance(max_words, int) or isinstance(max_words, bool) or max_words < 0:
            raise ValueError(f"split_words must be an integer >= 0, got {max_words!r}")
        self.max_words = max_words
        self.words: dict[int, list[set[str] | None]] = {}  # None: the position has held a value
        self.events: dict[tuple[int, tuple[str, ...]], int] = {}

    def observe(self, cluster_id: int, tokens: Sequence[str]) -> None:
        """Record a (masked, tokenised) content that Drain put in template ``cluster_id``."""
        if not self.max_words:
            return
        seen = self.words.get(cluster_id)
        if seen is None or len(seen) != len(tokens):
            seen = self.words[cluster_id] = [set() for _ in tokens]
        for i, token in enumerate(tokens):
            words = seen[i]
            if words is None or token in words:
                continue
            if not is_word(token) or len(words) >= self.max_words:
                seen[i] = None
            else:
                words.add(token)

    def split_positions(self, cluster_id: int, template_tokens: Sequence[str]) -> tuple[int, ...]:
        """Positions of the template that split it: Drain generalised them, and they have held
        only words, at most ``max_words``."""
        seen = self.words.get(cluster_id)
        if not self.max_words or seen is None or len(seen) != len(template_tokens):
            return ()
        return tuple(i for i, t in enumerate(template_tokens) if "<*>" in t and seen[i])

    def event(self, cluster_id: int, template_tokens: Sequence[str], tokens: Sequence[str],
              new_id: Callable[[], int]) -> tuple[int, tuple[str, ...]]:
        """(event id, event template tokens) of a content of template ``cluster_id``; ``new_id``
        gives the id of an event seen for the first time."""
        positions = self.split_positions(cluster_id, template_tokens)
        if not positions or len(tokens) != len(template_tokens):
            return cluster_id, tuple(template_tokens)
        words = tuple(tokens[i] for i in positions)
        key = (cluster_id, words)
        if key not in self.events:
            self.events[key] = new_id()
        out = list(template_tokens)
        for i, word in zip(positions, words):
            out[i] = word
        return self.events[key], tuple(out)

    # ------------------------------------------------------------ state (parsers.drain_state)

    def dump(self) -> dict:
        return {"max_words": self.max_words,
                "words": [[cid, [None if w is None else sorted(w) for w in seen]] for cid, seen in self.words.items()],
                "events": [[cid, list(words), eid] for (cid, words), eid in self.events.items()]}

    def load(self, data: object, check: Callable[[object, str], None]) -> None:
        """Restore from :meth:`dump`'s data; ``check(ok, what)`` raises on the first bad field.
        The running ``max_words`` is kept (it is a threshold, like Drain's similarity)."""
        check(isinstance(data, dict) and set(data) == {"max_words", "words", "events"}, "word_split")
        words: dict[int, list[set[str] | None]] = {}
        check(isinstance(data["words"], list), "word_split.words")
        for item in data["words"]:
            check(isinstance(item, list) and len(item) == 2 and _is_id(item[0]) and isinstance(item[1], list),
                  "word_split.words")
            check(all(w is None or (isinstance(w, list) and all(isinstance(x, str) for x in w)) for w in item[1]),
                  "word_split.words")
            words[item[0]] = [None if w is None else set(w) for w in item[1]]
        events: dict[tuple[int, tuple[str, ...]], int] = {}
        check(isinstance(data["events"], list), "word_split.events")
        for item in data["events"]:
            check(isinstance(item, list) and len(item) == 3 and _is_id(item[0]) and _is_id(item[2])
                  and isinstance(item[1], list) and all(isinstance(x, str) for x in item[1]), "word_split.events")
            events[(item[0], tuple(item[1]))] = item[2]
        self.words, self.events = words, events


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
