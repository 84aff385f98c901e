"""Batch formation: Nexus early drop (sliding window) against lazy drop."""

from __future__ import annotations

from collections import deque

import pytest

from agent.inference.runtime.batch_formation import DropPolicy, Request, form_batch


def queue_of(deadlines: list[float]) -> deque[Request]:
    return deque(Request("s", None, 0.0, d, lambda _o: None) for d in deadlines)


def latency(b: int) -> float:
    return 10.0 + 2.0 * b  # l(1) = 12, l(4) = 18


@pytest.mark.parametrize(
    ("policy", "deadlines", "batch", "want_batch", "want_dropped", "want_left"),
    [
        pytest.param(DropPolicy.EARLY, [100, 100, 100], 4, [0, 1, 2], [], [], id="early-all-fit"),
        # The head (deadline 15) cannot wait for a window of 4 (18 ms), but batch 1 (12 ms)
        # could still save it: skipped, not dropped.
        pytest.param(
            DropPolicy.EARLY,
            [15, 50, 50, 50, 50],
            4,
            [1, 2, 3, 4],
            [],
            [0],
            id="early-skips-but-keeps-savable",
        ),
        pytest.param(
            DropPolicy.EARLY,
            [5, 50, 50, 50, 50],
            4,
            [1, 2, 3, 4],
            [0],
            [],
            id="early-drops-hopeless",
        ),
        # l(2) = 14 fits the head's 15 ms, l(3) = 16 does not: a batch of two.
        pytest.param(
            DropPolicy.LAZY,
            [15, 50, 50, 50, 50],
            4,
            [0, 1],
            [],
            [2, 3, 4],
            id="lazy-shrinks-batch-for-head",
        ),
        pytest.param(DropPolicy.LAZY, [5, 50, 50], 4, [1, 2], [0], [], id="lazy-drops-expired"),
        pytest.param(DropPolicy.EARLY, [], 4, [], [], [], id="empty"),
    ],
)
def test_form_batch(policy, deadlines, batch, want_batch, want_dropped, want_left) -> None:
    queue = queue_of(deadlines)
    items = list(queue)
    chosen, dropped = form_batch(queue, 0.0, batch, latency, policy)
    assert [items.index(r) for r in chosen] == want_batch
    assert [items.index(r) for r in dropped] == want_dropped
    assert [items.index(r) for r in queue] == want_left


def test_batch_must_be_positive() -> None:
    with pytest.raises(ValueError):
        form_batch(queue_of([1.0]), 0.0, 0, latency, DropPolicy.EARLY)
