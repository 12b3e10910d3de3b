"""The in-memory cache of compiled constraints and automata: bounded in bytes, least recently used
evicted first (``LLMSERVE_CONSTRAINT_CACHE_MB``, see ``limits.py``).

Eviction never takes memory from a running request: a request's row holds its own reference to its
compiled form (the processor keeps it), so evicting only drops the cache's reference, and the
memory goes when the last request using the form ends. A form evicted while still in use stays
findable through a weak index (``live``), so a second request for the same constraint shares it
instead of compiling a second copy.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class MemoryCache:
    """key -> value with a byte size; the total stays within ``budget()`` bytes."""

    def __init__(self, budget: Callable[[], int]):
        self._budget = budget
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._live: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()
        self.nbytes = 0

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item[0]
            return self._live.get(key)

    def put(self, key: Hashable, value: Any, nbytes: int, *, weak: bool = False) -> None:
        """Keep ``value`` (``weak``: it can be weakly referenced, so the live index keeps finding it
        after eviction while something else holds it). A value over the whole budget is not kept."""
        budget = self._budget()
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            if weak:
                self._live[key] = value
            if nbytes > budget:
                return
            self._items[key] = (value, nbytes)
            self.nbytes += nbytes
            while self.nbytes > budget:
                _, (_, size) = self._items.popitem(last=False)
                self.nbytes -= size

    def discard(self, key: Hashable) -> None:
        """Forget ``key`` (a value superseded by a better one kept under another key)."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            self._live.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._live.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items
