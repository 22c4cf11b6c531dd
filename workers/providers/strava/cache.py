"""A small bounded cache (LRU + time-to-live) for provider lookups that save API budget."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class BoundedCache:
    """A thread-safe LRU with a size bound and a time-to-live; values are shared, never mutated.

    A pool serves many athletes for weeks: the size bound caps memory, and the TTL lets
    upstream changes (a renamed segment, a deleted blob) show through.
    """

    def __init__(self, max_entries: int, ttl_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError("a bounded cache needs max_entries >= 1 and ttl_s > 0")
        self.max_entries, self.ttl_s, self._clock = max_entries, ttl_s, clock
        self._items: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, key: Hashable) -> Any | None:
        now = self._clock()
        with self._lock:
            hit = self._items.get(key)
            if hit is None or hit[0] <= now:
                if hit is not None:
                    del self._items[key]
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return hit[1]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = (self._clock() + self.ttl_s, value)
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
                self.evictions += 1
