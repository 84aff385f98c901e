"""The bounded map: its bound, which entry goes first, recency on a read only when asked,
and its own lock under concurrent writers."""

from __future__ import annotations

import sys
import threading

import pytest

from contracts.bounded import BoundedMap


def test_past_the_bound_the_oldest_put_goes_first() -> None:
    m: BoundedMap[str, int] = BoundedMap(3)
    for i, key in enumerate("abcd"):
        m.put(key, i)
    assert len(m) == 3 and m.keys() == ["b", "c", "d"] and "a" not in m
    assert m.get("a") is None and m.get("b") == 1


def test_a_put_of_a_held_key_makes_it_the_newest() -> None:
    m: BoundedMap[str, int] = BoundedMap(3)
    for key in "abc":
        m.put(key, 0)
    m.put("a", 9)
    m.put("d", 0)
    assert m.keys() == ["c", "a", "d"] and m.get("a") == 9


def test_a_read_leaves_the_order_unless_touch_is_asked() -> None:
    m: BoundedMap[str, int] = BoundedMap(2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1 and "a" in m
    m.put("c", 3)
    assert m.keys() == ["b", "c"]  # a read of "a" did not save it
    assert m.get("b", touch=True) == 2
    m.put("d", 4)
    assert m.keys() == ["b", "d"]  # a touched read did: "c" went


def test_setdefault_keeps_a_held_key_and_its_place() -> None:
    m: BoundedMap[str, int] = BoundedMap(2)
    assert m.setdefault("a", 1) == 1
    m.put("b", 2)
    assert m.setdefault("a", 5) == 1
    m.put("c", 3)
    assert m.keys() == ["b", "c"]  # "a" stayed the oldest inserted


def test_pop_clear_and_defaults() -> None:
    m: BoundedMap[tuple[str, str], str] = BoundedMap(4)
    m.put(("ns", "p"), "x")
    assert m.get(("ns", "q"), "none") == "none" and m.pop(("ns", "q"), "none") == "none"
    assert m.pop(("ns", "p")) == "x" and len(m) == 0
    m.put(("ns", "p"), "y")
    m.clear()
    assert m.keys() == [] and m.pop(("ns", "p")) is None


def test_a_bound_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        BoundedMap(0)


def test_concurrent_writers_keep_the_bound_and_one_winner_per_key() -> None:
    m: BoundedMap[int, int] = BoundedMap(10_000)
    trimmed: BoundedMap[int, int] = BoundedMap(50)
    won = [0] * 8
    start = threading.Barrier(8)

    def writer(t: int) -> None:
        start.wait()
        for k in range(2_000):
            if m.setdefault(k, t) == t:
                won[t] += 1
            trimmed.put(t * 100_000 + k, k)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert sum(won) == 2_000 == len(m)  # each key set once, by one thread
    assert len(trimmed) == 50 and len(set(trimmed.keys())) == 50
