"""Names from users (sources, tasks, models, partitions) that become folders and model names.

One rule, checked where a name enters (the catalogue, the CLI, the data root): 1-64 characters
of ``[A-Za-z0-9_.-]`` starting with a letter or digit, matched whole (``fullmatch``: a trailing
newline does not pass), so no ``..``, ``/``, NUL, absolute path or hidden file can pass.
"""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class UnsafeName(ValueError):
    """A name from a user (source, task, model, partition) that cannot safely become a folder or a
    model name: the CLI refuses it with exit code 2 before anything is written."""


def check_name(name, what: str = "name") -> str:
    """``name`` when it is 1-64 characters of [A-Za-z0-9_.-] starting with a letter or digit (no
    ``..``, ``/``, NUL, absolute path or hidden file can pass); :class:`UnsafeName` otherwise."""
    if not isinstance(name, str) or not NAME.fullmatch(name):  # fullmatch: no trailing newline
        shown = repr(name) if not isinstance(name, str) or len(name) <= 80 else repr(name[:80]) + "..."
        raise UnsafeName(f"{what} {shown} is not a safe name: use 1-64 characters of [A-Za-z0-9_.-], starting "
                         "with a letter or digit")
    return name
