"""A map of at most ``limit`` entries, thread-safe, that forgets its oldest entry first.

The extender keeps many small per-pod (or per-token, per-digest) memories between two
requests: what prioritize scored for bind, what bind wrote, which binds got no answer.
Each must stay bounded whatever the cluster sends, and each is read and written from
request threads at once. This is the one implementation of that map.

"Oldest" is the least recently put: :meth:`BoundedMap.put` moves its key to the newest
end; a read leaves the order as it is unless asked to (``touch=True``: least recently
used); :meth:`BoundedMap.setdefault` keeps a present key where it is (oldest inserted).
Expiry times and other fields are the caller's: store them in the value.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
D = TypeVar("D")
_MISSING = object()


class BoundedMap(Generic[K, V]):
    """At most ``limit`` entries, the least recently put (or touched) dropped first;
    every method takes the map's own lock."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"a bounded map holds at least one entry, not {limit}")
        self.limit = limit
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: K, value: V) -> None:
        """Set ``key`` to ``value`` as the newest entry; the oldest go past the bound."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self._trim()

    def setdefault(self, key: K, value: V) -> V:
        """The value held for ``key``, left where it is in the order; when there is none,
        ``value``, put as the newest entry."""
        with self._lock:
            held = self._entries.get(key, _MISSING)
            if held is not _MISSING:
                return held
            self._entries[key] = value
            self._trim()
            return value

    @overload
    def get(self, key: K, *, touch: bool = False) -> V | None: ...

    @overload
    def get(self, key: K, default: D, *, touch: bool = False) -> V | D: ...

    def get(self, key, default=None, *, touch=False):
        """The value held for ``key`` or ``default``; ``touch``: a hit becomes the newest."""
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is _MISSING:
                return default
            if touch:
                self._entries.move_to_end(key)
            return value

    @overload
    def pop(self, key: K) -> V | None: ...

    @overload
    def pop(self, key: K, default: D) -> V | D: ...

    def pop(self, key, default=None):
        """Remove ``key``; its value, or ``default`` when it was not held."""
        with self._lock:
            return self._entries.pop(key, default)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list[K]:
        """The keys, oldest first (a copy)."""
        with self._lock:
            return list(self._entries)

    def _trim(self) -> None:
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
