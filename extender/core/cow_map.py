"""A mapping split into shards, copied one shard at a time (copy on write).

The GPU table's per-row and per-pod maps (:class:`extender.core.table.GpuTable`) are
handed out in snapshots that outlive the next write. A plain dict would have to be
copied whole by a write beside a live snapshot: O(cluster) for every bind. Here
:meth:`ShardedMap.copy` copies only the shard index (O(shards)) and shares the shards;
the first write to a shard after a copy copies that shard alone (a few dozen entries).

Iteration goes shard by shard, not in insertion order: the table only looks keys up.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, MutableMapping
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def row_block(row: int) -> int:
    """Shard of a table row: blocks of 64 rows (8 nodes of 8 GPUs)."""
    return row >> 6


def key_bucket(key: Hashable) -> int:
    """Shard of any other key (a pod UID): one of 256 hash buckets."""
    return hash(key) & 255


class ShardedMap(MutableMapping[K, V]):
    """A dict of shards, each a dict; a shard shared with a copy is copied before a write."""

    __slots__ = ("_shard_of", "_shards", "_owned")

    def __init__(self, shard_of: Callable[[K], int] = key_bucket,
                 items: Any = ()):
        self._shard_of = shard_of
        self._shards: dict[int, dict[K, V]] = {}
        self._owned: set[int] = set()
        """Shards only this map holds (written in place); the others are shared."""
        for key, value in dict(items).items():
            self[key] = value

    def __getitem__(self, key: K) -> V:
        shard = self._shards.get(self._shard_of(key))
        if shard is None:
            raise KeyError(key)
        return shard[key]

    def get(self, key: K, default: Any = None) -> Any:
        shard = self._shards.get(self._shard_of(key))
        return default if shard is None else shard.get(key, default)

    def __contains__(self, key: object) -> bool:
        shard = self._shards.get(self._shard_of(key))  # type: ignore[arg-type]
        return shard is not None and key in shard

    def __setitem__(self, key: K, value: V) -> None:
        s = self._shard_of(key)
        if s not in self._owned:
            self._shards[s] = dict(self._shards.get(s, ()))
            self._owned.add(s)
        self._shards[s][key] = value

    def __delitem__(self, key: K) -> None:
        s = self._shard_of(key)
        shard = self._shards.get(s)
        if shard is None or key not in shard:
            raise KeyError(key)
        if len(shard) == 1:  # the shard goes: nothing of it to copy
            del self._shards[s]
            self._owned.discard(s)
            return
        if s not in self._owned:
            self._shards[s] = shard = dict(shard)
            self._owned.add(s)
        del shard[key]

    def __iter__(self) -> Iterator[K]:
        for shard in list(self._shards.values()):
            yield from shard

    def __len__(self) -> int:
        return sum(len(shard) for shard in self._shards.values())

    def __repr__(self) -> str:
        return f"ShardedMap({dict(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its items: a hash bucket may differ in another process.
        return (ShardedMap, (self._shard_of, dict(self)))

    def copy(self) -> ShardedMap[K, V]:
        """A map sharing every shard with this one: O(shards); from now on both copy a
        shard before they first write it."""
        other: ShardedMap[K, V] = ShardedMap(self._shard_of)
        other._shards = dict(self._shards)
        self._owned = set()
        return other


class OrderedShardedMap(MutableMapping[K, V]):
    """A :class:`ShardedMap` that iterates in insertion order, as a dict does (a key keeps
    its place when its value is replaced and goes last when deleted and added again):
    for maps whose order decides something (the order placements are applied in)."""

    __slots__ = ("_map", "_next")

    def __init__(self, shard_of: Callable[[K], int] = key_bucket):
        self._map: ShardedMap[K, tuple[int, V]] = ShardedMap(shard_of)
        self._next = 0

    def __getitem__(self, key: K) -> V:
        return self._map[key][1]

    def get(self, key: K, default: Any = None) -> Any:
        entry = self._map.get(key)
        return default if entry is None else entry[1]

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __setitem__(self, key: K, value: V) -> None:
        entry = self._map.get(key)
        if entry is None:
            entry, self._next = (self._next, value), self._next + 1
        self._map[key] = (entry[0], value)

    def __delitem__(self, key: K) -> None:
        del self._map[key]

    def __iter__(self) -> Iterator[K]:
        # O(n log n): the readers that iterate (a rebuild, a relist, /v1/state in full)
        # are O(n) already; lookups and writes stay O(a shard).
        return iter([key for _, key in sorted((seq, key) for key, (seq, _) in
                                              self._map.items())])

    def __len__(self) -> int:
        return len(self._map)

    def __repr__(self) -> str:
        return f"OrderedShardedMap({dict(self)!r})"

    def copy(self) -> OrderedShardedMap[K, V]:
        """A map sharing every shard with this one (:meth:`ShardedMap.copy`)."""
        other: OrderedShardedMap[K, V] = OrderedShardedMap()
        other._map, other._next = self._map.copy(), self._next
        return other
