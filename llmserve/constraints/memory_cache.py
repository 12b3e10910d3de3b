"""The in-memory cache of compiled constraints and automata: bounded in bytes, least recently used
evicted first (``LLMSERVE_CONSTRAINT_CACHE_MB``, see ``limits.py``).

Eviction never takes memory from a running request: a request's row holds its own reference to its
compiled form (the processor keeps it), so evicting only drops the cache's reference, and the
memory goes when the last request using the form ends. A form evicted while still in use stays
findable through a weak index (``live``), so a second request for the same constraint shares it
instead of compiling a second copy.

Compressed forms hold their large mask rows in common (``shared_rows.py``): the cache counts each
such row once for all the values it keeps that name it, so sharing lets it keep more forms.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np


class MemoryCache:
    """key -> value with a byte size; the total stays within ``budget()`` bytes."""

    def __init__(self, budget: Callable[[], int]):
        self._budget = budget
        self._lock = threading.Lock()
        # key -> (value, its own bytes, the ids of the shared arrays it names)
        self._items: OrderedDict[Hashable, tuple[Any, int, tuple[int, ...]]] = OrderedDict()
        self._live: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()
        # id -> [how many kept values name it, the array]: held here so that its id is not reused
        self._shared: dict[int, list[Any]] = {}
        self.nbytes = 0

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item[0]
            return self._live.get(key)

    def put(
        self, key: Hashable, value: Any, nbytes: int, *, weak: bool = False, shared: Sequence[np.ndarray] = ()
    ) -> None:
        """Keep ``value`` at ``nbytes`` plus the ``shared`` arrays it holds in common with other values,
        those counted once for all that name them (``weak``: it can be weakly referenced, so the live
        index keeps finding it after eviction while something else holds it). A value over the whole
        budget is not kept."""
        budget = self._budget()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._forget(old)
            if weak:
                self._live[key] = value
            unique = {id(a): a for a in shared}
            if nbytes + sum(a.nbytes for a in unique.values()) > budget:
                return
            for i, a in unique.items():
                held = self._shared.setdefault(i, [0, a])
                held[0] += 1
                if held[0] == 1:
                    self.nbytes += int(a.nbytes)
            self._items[key] = (value, nbytes, tuple(unique))
            self.nbytes += nbytes
            while self.nbytes > budget:
                _, item = self._items.popitem(last=False)
                self._forget(item)

    def _forget(self, item: tuple[Any, int, tuple[int, ...]]) -> None:
        _value, nbytes, ids = item
        self.nbytes -= nbytes
        for i in ids:
            held = self._shared[i]
            held[0] -= 1
            if held[0] == 0:
                self.nbytes -= int(held[1].nbytes)
                del self._shared[i]

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (a value superseded by a better one kept under another key)."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._forget(old)
            self._live.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._live.clear()
            self._shared.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items
