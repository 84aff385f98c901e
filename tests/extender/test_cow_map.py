"""extender.core.cow_map: a copy shares the shards, a write copies one; the ordered map
iterates as a dict does."""

from __future__ import annotations

import random
from copy import deepcopy

from extender.core.cow_map import OrderedShardedMap, ShardedMap, row_block


def test_a_write_after_a_copy_copies_one_shard_and_leaves_the_copy_alone():
    original = ShardedMap(row_block, {row: (row,) for row in range(640)})
    snapshot = original.copy()
    original[3] = ("new",)
    del original[200]
    assert snapshot[3] == (3,) and 200 in snapshot and snapshot == {r: (r,) for r in range(640)}
    assert original[3] == ("new",) and 200 not in original and len(original) == 639
    changed = {row_block(3), row_block(200)}
    shared = [s for s in original._shards if original._shards[s] is snapshot._shards[s]]
    assert sorted(shared) == sorted(set(range(10)) - changed)  # only those two were copied
    snapshot[5] = ("other",)  # the copy writes too, without touching the original
    assert original[5] == (5,)


def test_missing_keys_read_as_a_dict_reads_them():
    m: ShardedMap[str, int] = ShardedMap()
    assert m.get("x") is None and m.get("x", 7) == 7 and "x" not in m and m == {}
    m["x"] = 1
    del m["x"]
    try:
        del m["x"]
    except KeyError:
        pass
    else:
        raise AssertionError("deleting a missing key must raise KeyError")


def test_the_ordered_map_iterates_in_a_dict_s_order_through_copies():
    rng = random.Random(7)
    reference: dict[str, int] = {}
    m: OrderedShardedMap[str, int] = OrderedShardedMap()
    held = []
    for step in range(3000):
        key = f"pod-{rng.randrange(400)}"
        if key in reference and rng.random() < 0.4:
            del reference[key], m[key]
        else:
            reference[key] = m[key] = step
        if step % 97 == 0:  # a snapshot holds a copy; the writer goes on with its own
            held.append((dict(reference), m))
            m = m.copy()
    assert list(m.items()) == list(reference.items())
    for expected, copy in held:
        assert list(copy.items()) == list(expected.items())


def test_a_map_sent_to_another_process_is_rebuilt_from_its_items():
    """What a process pool does with a table (``__reduce__``), without writing any file."""
    m: ShardedMap[str, int] = ShardedMap(items={"a": 1, "b": 2})
    assert deepcopy(m) == {"a": 1, "b": 2}
