"""The process's own peak resident memory, for reports and benchmarks.

``getrusage(RUSAGE_SELF).ru_maxrss`` is not it for a child process on Linux: the high-water
mark of the parent's memory at ``fork`` survives the ``exec``, so a small child of a large
parent reports the parent's peak (measured here: a child of a 1.4 GB parent said 1,442 MB,
its own peak was 11 MB). ``VmHWM`` in ``/proc/self/status`` belongs to the process's own
address space, which ``exec`` replaces, so it is read first; ``ru_maxrss`` is the fallback
where there is no ``/proc`` (macOS reports bytes there, Linux KiB).
"""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.M)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    try:
        match = _HWM.search(Path("/proc/self/status").read_text())
    except OSError:
        match = None
    if match:
        return int(match.group(1)) / 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024
