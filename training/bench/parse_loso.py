"""Leave-one-system-out Grouping Accuracy: how well the parser's default settings transfer.

A default chosen on the systems it is scored on says little about a user's own logs (issue 49:
masks chosen on eight LogHub systems raised their GA and left eight others where they were).
This module measures the *choice*, not only its result:

* ``GRID``: the settings a default could take -- ``mask_shapes`` and ``split_words``
  (parsers.drain, parsers.word_split), Drain's similarity threshold ``sim_th`` and ``depth``.
* For every dataset parsed with the default settings (a header-only format or a detected
  header; never a preset, whose settings are its own), the setting with the best mean GA over
  **the other datasets** is chosen (ties: the first in grid order, the defaults first), and the
  dataset is scored with it: ``ga_loso``. Their mean is ``mean_ga_loso``.
* ``best_on_all``: the setting with the best mean GA over every dataset -- what the defaults
  should be. ``defaults_are_best`` says whether ``LogFormat``'s defaults equal it.

The masks are not in the grid: they are rules about value shapes (parsers.presets), fixed in code.
Nothing here reads a dataset's ground truth except the scorer, and what adapts per source (the
word splits) reads only the source's own lines; so a dataset whose left-out choice equals the
defaults has ``ga_loso == ga``.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import fields, replace

from parsers.presets import LogFormat

log = logging.getLogger(__name__)

# each axis lists the default first: a tie goes to it
GRID: dict[str, tuple] = {"mask_shapes": (True, False), "split_words": (3, 0, 2, 4, 6), "sim_th": (0.5, 0.4, 0.6),
                          "depth": (4, 5)}
_DEFAULTS = {f.name: f.default for f in fields(LogFormat) if f.name in GRID}


def settings_grid(grid: dict[str, tuple] = GRID) -> list[dict]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def with_settings(fmt: LogFormat, setting: dict) -> LogFormat:
    """``fmt`` with the grid's values in place of its *default* ones (a value the format sets
    itself is kept)."""
    return replace(fmt, **{k: v for k, v in setting.items() if getattr(fmt, k) == _DEFAULTS[k]})


def leave_one_out(datasets: dict[str, tuple], score, grid: dict[str, tuple] = GRID) -> dict:
    """``datasets``: ``{name: (lines, format)}``; ``score(name, lines, fmt) -> GA``. Returns
    ``{"ga_loso": {name: GA}, "chosen_without": {name: setting}, "best_on_all": setting,
    "defaults_are_best": bool, "grid": grid, "settings": n}`` (empty ``ga_loso`` below two datasets)."""
    settings = settings_grid(grid)
    table = []  # per setting: {name: GA}
    for i, setting in enumerate(settings):
        table.append({name: score(name, lines, with_settings(fmt, setting)) for name, (lines, fmt) in datasets.items()})
        log.info("setting %d/%d %s: mean GA %.4f", i + 1, len(settings), setting,
                 sum(table[-1].values()) / max(1, len(datasets)))

    def best(names: list[str]) -> int:
        means = [sum(row[n] for n in names) / len(names) for row in table]
        return max(range(len(settings)), key=lambda i: (means[i], -i))

    names = list(datasets)
    out: dict = {"grid": {k: list(v) for k, v in grid.items()}, "settings": len(settings), "ga_loso": {},
                 "chosen_without": {}}
    if not names:
        return out
    on_all = best(names)
    out["best_on_all"] = settings[on_all]
    out["defaults_are_best"] = all(settings[on_all][k] == _DEFAULTS[k] for k in grid)
    if len(names) < 2:
        return out
    for name in names:
        chosen = best([n for n in names if n != name])
        out["ga_loso"][name] = round(table[chosen][name], 4)
        out["chosen_without"][name] = settings[chosen]
    return out
