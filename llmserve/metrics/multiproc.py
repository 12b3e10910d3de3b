"""The Prometheus multiprocess folder: which writer processes are gone, and marking them dead.

prometheus_client writes one `<kind>_<pid>.db` file per process and metric kind (`counter_123.db`,
`gauge_livesum_123.db`, ...). A gauge whose multiprocess mode starts with `live` must stop counting when its
process dies; `multiprocess.mark_process_dead(pid)` removes exactly those files (counters and histograms of a dead
process stay: their totals must not go down). Nothing else calls it for a crashed worker, so the reader does,
before each read. Pids are checked in this host's pid namespace: a reader in another container sees every writer
as dead, so it must share the writers' pid namespace (the folder is shared anyway).
"""

from __future__ import annotations

import os
from pathlib import Path


def live_gauge_writers(folder: Path) -> set[int]:
    """Pids of processes that have `live*` gauge files in the folder: the files a dead process must lose."""
    pids: set[int] = set()
    for name in os.listdir(folder):
        if not (name.startswith("gauge_live") and name.endswith(".db")):
            continue
        tail = name[:-3].rsplit("_", 1)[-1]
        if tail.isdigit():
            pids.add(int(tail))
    return pids


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    # A child that exited but was not reaped yet still answers kill(pid, 0); it is dead for the metrics.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def mark_dead_writers(folder: Path) -> list[int]:
    """Mark every writer of the folder that still has live-gauge files but is no longer alive as dead; returns
    their pids. Marking removes those files, so a pid is marked once (and again only if a new process reuses it)."""
    from prometheus_client import multiprocess

    marked = []
    for pid in sorted(live_gauge_writers(folder)):
        if pid != os.getpid() and not is_alive(pid):
            multiprocess.mark_process_dead(pid, str(folder))
            marked.append(pid)
    return marked
