"""The pure weighted-fair queue: k-means classes, weights, apportioning, starvation."""

from __future__ import annotations

import numpy as np
import pytest

from extender.queue.fair import (
    FairQueue,
    QueueConfig,
    QueueError,
    QueueItem,
    apportion,
    cluster_l1,
    queue_weights,
)


@pytest.mark.parametrize(
    ("lengths", "medians", "want"),
    [
        pytest.param([3, 2], [0.0, 0.0], [3.0, 2.0], id="all-new-arrivals-weight-is-length"),
        pytest.param([2, 4], [10.0, 0.5], [20.0, 4.0], id="median-wait-times-length"),
        pytest.param([0, 5], [99.0, 2.0], [0.0, 10.0], id="empty-class-weighs-nothing"),
    ],
)
def test_weights_follow_horus_formula(lengths: list[int], medians: list[float],
                                      want: list[float]) -> None:
    assert queue_weights(np.array(lengths), np.array(medians)).tolist() == want


@pytest.mark.parametrize(
    ("weights", "lengths", "slots", "want"),
    [
        pytest.param([1, 1], [5, 5], 4, [2, 2], id="equal-weights-split-evenly"),
        pytest.param([3, 1], [5, 5], 4, [3, 1], id="proportional"),
        pytest.param([1, 1, 1], [5, 5, 5], 4, [2, 1, 1], id="remainder-tie-goes-to-lower-index"),
        pytest.param([10, 1], [1, 5], 4, [1, 3], id="short-class-gives-slots-away"),
        pytest.param([0, 0], [2, 2], 3, [2, 1], id="zero-weights-share-equally"),
        pytest.param([1], [2], 5, [2], id="never-more-than-queued"),
        pytest.param([5, 1], [3, 3], 0, [0, 0], id="no-slots"),
    ],
)
def test_apportion(weights: list[float], lengths: list[int], slots: int, want: list[int]) -> None:
    assert apportion(weights, lengths, slots) == want


def _features(rows: list[tuple[float, float, float, float]]) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def test_kmeans_separates_obvious_groups_and_is_deterministic() -> None:
    small = [(1, 10, 1, 1000), (1, 12, 1, 1100), (1, 11, 1, 900)]
    heavy = [(1, 90, 1, 6000), (1, 95, 1, 6500)]
    wide = [(4, 50, 8, 3000), (4, 55, 8, 3100)]
    x = _features(small + heavy + wide)
    fit = cluster_l1(x, 3)
    labels = fit.assign(x).tolist()
    assert len({labels[0], labels[1], labels[2]}) == 1
    assert labels[3] == labels[4] and labels[5] == labels[6]
    assert len(set(labels)) == 3
    again = cluster_l1(x[::-1].copy(), 3).assign(x).tolist()
    assert again == labels  # classes renumbered by centroid: input order does not matter


def test_kmeans_with_fewer_distinct_points_than_k() -> None:
    x = _features([(1, 50, 1, 2000)] * 4)
    assert cluster_l1(x, 3).centroids.shape[0] == 1


def _item(key: str, t: float, util: float = 50.0, mem: float = 2000.0, gpus: int = 1) -> QueueItem:
    return QueueItem(key=key, enqueued_at_seconds=t, util_percent=util, mem_mib=mem,
                     gpus_per_task=gpus)


def test_single_queue_releases_the_oldest_beta_jobs() -> None:
    q = FairQueue(QueueConfig(k=1, beta=2))
    q.extend([_item("c", 30.0), _item("a", 10.0), _item("b", 20.0)])
    assert [i.key for i in q.select(now_seconds=40.0)] == ["a", "b"]
    assert len(q) == 3  # select does not dequeue


def test_longer_waiting_class_gets_more_slots() -> None:
    q = FairQueue(QueueConfig(k=2, beta=4, starvation_seconds=1e9))
    # Two light jobs that waited long, six heavy ones that just arrived.
    q.extend([_item(f"old{i}", 0.0, util=10, mem=500) for i in range(2)])
    q.extend([_item(f"new{i}", 99.0, util=90, mem=7000) for i in range(6)])
    picked = [i.key for i in q.select(now_seconds=100.0)]
    # w_old = 2 * 100 = 200, w_new = max(6, 1 * 6) = 6: the old class takes what it has.
    assert picked[:2] == ["old0", "old1"]
    assert len(picked) == 4
    weights = sorted(c.weight for c in q.last_classes)
    assert weights == [6.0, 200.0]


def test_starving_job_goes_first_even_from_a_light_class() -> None:
    q = FairQueue(QueueConfig(k=2, beta=1, starvation_seconds=50.0))
    q.extend([_item(f"busy{i}", 90.0 + i, util=90, mem=7000) for i in range(8)])
    q.add(_item("starved", 40.0, util=5, mem=100))
    assert [i.key for i in q.select(now_seconds=95.0)] == ["starved"]


def test_starvation_guard_respects_the_slot_budget() -> None:
    q = FairQueue(QueueConfig(k=1, beta=3, starvation_seconds=10.0))
    q.extend([_item(f"s{i}", float(i)) for i in range(5)])
    assert [i.key for i in q.select(now_seconds=100.0, slots=2)] == ["s0", "s1"]


def test_remove_replace_and_compaction_keep_the_queue_consistent() -> None:
    q = FairQueue(QueueConfig(k=2, beta=200))
    q.extend([_item(f"j{i}", float(i)) for i in range(150)])
    for i in range(0, 150, 2):
        assert q.remove(f"j{i}") is not None
    assert q.remove("missing") is None
    q.add(_item("j1", 500.0, util=99))  # replaces the queued j1
    assert len(q) == 75
    keys = [i.key for i in q.select(now_seconds=1000.0)]
    assert sorted(keys) == sorted(f"j{i}" for i in range(1, 150, 2))
    assert keys[-1] == "j1" and q.class_of("j1") is not None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"k": 0}, "k", id="k"),
        pytest.param({"beta": 0}, "beta", id="beta"),
        pytest.param({"starvation_seconds": -1.0}, "starvation_seconds", id="starvation"),
        pytest.param({"refit_every_rounds": 0}, "refit_every_rounds", id="refit"),
    ],
)
def test_config_rejects_out_of_range(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(QueueError) as err:
        QueueConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_non_finite_enqueue_time_is_rejected() -> None:
    with pytest.raises(QueueError) as err:
        FairQueue().add(_item("x", float("nan")))
    assert err.value.field == "enqueued_at_seconds"
