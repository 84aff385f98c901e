"""Bind takes its decision from prioritize's evaluation where nothing it reads changed
(``extender.service.scored``), and decides afresh where anything did."""

from __future__ import annotations

from typing import Any

import pytest
from extender_builders import args, binding, make_app, node, training

from extender.service import verbs


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes bind decided on afresh (``place``), in order."""
    calls: list[str] = []
    real = verbs.place

    def counted(snap: Any, node_name: str, *rest: Any, **kwargs: Any) -> Any:
        calls.append(node_name)
        return real(snap, node_name, *rest, **kwargs)
    monkeypatch.setattr(verbs, "place", counted)
    return calls


def _schedule(client: Any, p: dict[str, Any], names: list[str]) -> None:
    passed = client.post("/filter", json=args(p, names)).get_json()["NodeNames"]
    assert client.post("/prioritize", json=args(p, passed)).status_code == 200


def _bind(client: Any, source: Any, p: dict[str, Any], node_name: str) -> dict[str, str]:
    assert client.post("/bind", json=binding(p, node_name)).get_json() == {"Error": ""}
    bound = next(q for q in source.pods() if q["metadata"]["uid"] == p["metadata"]["uid"])
    return {k: v for k, v in bound["metadata"]["annotations"].items()
            if k.startswith("tandem.io/") and k != "tandem.io/decided-by"}


def _cluster() -> tuple[Any, Any, Any, Any]:
    app, ext, source, clock = make_app([node("n1", 4), node("n2", 4)])
    for name, mem in (("a", 9000), ("b", 20000)):  # GPUs of different loads: a real choice
        p = training(name, util=30, mem=mem, uid=name)
        source.create_pod(p)
        with app.test_client() as c:
            assert c.post("/bind", json=binding(p, "n1")).get_json() == {"Error": ""}
    return app, ext, source, clock


def test_bind_after_prioritize_decides_what_place_decides(places: list[str]) -> None:
    reused = _cluster()
    fresh = _cluster()
    places.clear()
    p = training("p", util=25, mem=12000, uid="p")
    for cluster in (reused, fresh):
        cluster[2].create_pod(p)
    with reused[0].test_client() as c:
        _schedule(c, p, ["n1", "n2"])
        got = _bind(c, reused[2], p, "n1")
    assert places == []  # prioritize's figures for n1 were taken
    with fresh[0].test_client() as c:
        wanted = _bind(c, fresh[2], p, "n1")  # no prioritize: bind places on n1 itself
    assert places == ["n1"]
    assert got == wanted


def test_a_node_changed_since_prioritize_is_decided_again(places: list[str]) -> None:
    app, _, source, _ = make_app([node("n1", 2), node("n2", 2)])
    p = training("p", util=30, mem=30000, uid="p")
    q = training("q", util=30, mem=30000, uid="q")
    for x in (p, q):
        source.create_pod(x)
    with app.test_client() as c:
        _schedule(c, p, ["n1", "n2"])
        first = _bind(c, source, q, "n1")  # takes the GPU prioritize chose for p on n1
        second = _bind(c, source, p, "n1")
    assert places == ["n1", "n1"]  # q had no prioritize; p's node changed since
    # Two 30000 MiB pods cannot share a 40 GB GPU: prioritize's GPU would have been q's.
    assert first["tandem.io/gpu-index"] != second["tandem.io/gpu-index"]


def test_an_observation_gone_stale_since_prioritize_is_decided_again(
        places: list[str]) -> None:
    app, ext, source, clock = make_app([node("n1", 2), node("n2", 2)])
    gpus = ext.state.node_gpus("n1")
    ext.state.report("n1", gpus, [90.0, 0.0], [35000.0, 0.0])  # GPU 0 busy, as measured
    p = training("p", util=30, mem=10000, uid="p")
    source.create_pod(p)
    with app.test_client() as c:
        _schedule(c, p, ["n1", "n2"])
        clock.now += ext.config.current().reports.staleness_seconds + 1
        _bind(c, source, p, "n1")
    assert places == ["n1"]


def test_the_evaluation_is_kept_for_its_own_pod_only(places: list[str]) -> None:
    app, _, source, _ = make_app([node("n1", 2), node("n2", 2)])
    p = training("p", uid="p")
    r = training("r", uid="r")
    for x in (p, r):
        source.create_pod(x)
    with app.test_client() as c:
        _schedule(c, p, ["n1", "n2"])
        _bind(c, source, r, "n1")  # r was never prioritized: nothing of p's is used for it
        _bind(c, source, p, "n2")  # p's, on a node r left alone
    assert places == ["n1"]
