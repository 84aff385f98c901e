"""The pod watch knows bind's own write without decoding it (``extender.cluster.written``),
and decodes everything else as before."""

from __future__ import annotations

import time

import pytest
from fault_cluster import PlainWatch, cluster, k8s_pod

from extender.cluster import kube
from extender.cluster.written import WrittenAnnotations

INPUTS = (("tandem.io/gpu-mem-mib", "10000"), ("tandem.io/gpu-util", "20"))
SENT = {"tandem.io/gpu-index": "0", "tandem.io/placement-signature": "sig"}


def _pod_annotations(**changes: str | None) -> dict[str, str]:
    ann = {**dict(INPUTS), **SENT, "kubectl.kubernetes.io/last-applied": "{}"}
    for key, value in changes.items():
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value
    return ann


@pytest.mark.parametrize(("node", "changes", "known"), [
    ("n1", {}, True),
    ("n1", {"kubectl.kubernetes.io/last-applied": "{\"x\": 1}"}, True),  # not tandem's
    ("n2", {}, False),
    ("n1", {"tandem.io/gpu-index": "1"}, False),
    ("n1", {"tandem.io/gpu-index": None}, False),
    ("n1", {"tandem.io/gpu-util": "25"}, False),  # an input edited before the Binding
    ("n1", {"tandem.io/batch-size": "x"}, False),  # a key bind never wrote
], ids=["same", "other-owner-key", "other-node", "edited", "removed", "input", "added"])
def test_only_exactly_what_bind_sent_is_known(node: str, changes: dict, known: bool) -> None:
    written = WrittenAnnotations()
    written.note("u", "n1", INPUTS, SENT)
    assert written.unchanged("u", node, _pod_annotations(**changes)) is known


def test_forgotten_and_oldest_pods_are_decoded_again() -> None:
    written = WrittenAnnotations(limit=2)
    for uid in ("a", "b", "c"):
        written.note(uid, "n1", INPUTS, SENT)
    written.forget("c")
    assert [written.unchanged(u, "n1", _pod_annotations()) for u in "abc"] == \
        [False, True, False]
    assert not written.unchanged("b", "n1", None)


def test_the_watch_decodes_no_bound_event_of_bind_and_still_flags_an_edit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str] = []
    real = kube.placement_from_pod

    def counted(pod):
        decoded.append(pod["metadata"]["name"])
        return real(pod)
    monkeypatch.setattr(kube, "placement_from_pod", counted)
    with cluster(nodes=1) as c:
        r = c.replica(watch=PlainWatch)
        r.source.start(r.state)
        for name in ("a", "b"):
            c.fake.put_pod(k8s_pod(name, {"tandem.io/gpu-util": "20",
                                          "tandem.io/gpu-mem-mib": "10000"}))
            assert r.filter(c.fake, name, ["gpu-0"])["NodeNames"] == ["gpu-0"]
            assert r.bind(name, "gpu-0") == {"Error": ""}
        deadline = time.monotonic() + 10
        while any(r.state.placement_of(f"uid-{n}") is None
                  or r.state.snapshot().placements.get(f"uid-{n}", True) is not None
                  for n in "ab"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert decoded == []  # both bound events were bind's own writes
        pod = c.fake.pod("ml", "a")
        pod["metadata"]["annotations"]["tandem.io/gpu-index"] = "3"
        c.fake.put_pod(pod)
        while True:
            r.source.drain_events()
            if any(e["reason"] == "TandemPlacementUntrusted" for e in c.fake.events):
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert set(decoded) == {"a"}  # the edited pod's events only
