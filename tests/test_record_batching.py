"""Placement records under kube-scheduler's concurrent binds (#28): binds on one node share
record writes (group commit) and none is bound without its entry in the record.

Against the loopback API server (benchmarks/fake_kube_api.py), through ``KubeSource``."""

from __future__ import annotations

import threading
import time

import pytest
from bench_modules import fake_kube_api
from extender_builders import placement
from fault_cluster import cluster, k8s_pod, ledger
from kubernetes import client

from extender.cluster.kube import KubeSource
from extender.cluster.records import PlacementRecords, encode_entry
from extender.core import PodRef
from extender.errors import SourceError

RECORD = ("tandem-system", "tandem-placements-gpu-0")
PODS = 16


@pytest.fixture
def fake():
    pods = [{"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
             "spec": {"containers": []}, "status": {"phase": "Pending"}} for i in range(PODS)]
    server = fake_kube_api.FakeKubeApi(pods=pods)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def source(fake):
    api = client.CoreV1Api(client.ApiClient(client.Configuration(host=fake.url)))
    src = KubeSource(api, background_events=False)
    src.records.load_all()
    yield src
    src.stop()


class HeldFirstWrite:
    """Holds the records' first write in flight until released; keeps what each write held."""

    def __init__(self, records: PlacementRecords):
        self.records, self.real = records, records._put
        self.written: list[set[str]] = []
        self.entered, self.release = threading.Event(), threading.Event()
        records._put = self._put  # type: ignore[method-assign]

    def _put(self, node, version, data):
        self.written.append(set(data))
        if len(self.written) == 1:
            self.entered.set()
            assert self.release.wait(10)
        self.real(node, version, data)

    def gathered(self, node: str) -> int:
        """Entries waiting for the next write of ``node``'s record."""
        batch = self.records._queues[node].gathering
        return 0 if batch is None else len(batch.entries)


def bind_all(source, indices, errors):
    def bind(i):
        try:
            source.bind(PodRef("ml", f"p{i}", f"u{i}"), "gpu-0", {},
                        placement(f"u{i}", pod=f"ml/p{i}", node="gpu-0"))
        except SourceError as exc:
            errors[i] = str(exc)
    threads = [threading.Thread(target=bind, args=(i,)) for i in indices]
    for t in threads:
        t.start()
    return threads


def wait_for(check, what):
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def held_burst(source, writes, later):
    """Bind p0 and hold its record write; bind ``later`` meanwhile: they gather."""
    errors: dict[int, str] = {}
    threads = bind_all(source, [0], errors)
    assert writes.entered.wait(10)
    threads += bind_all(source, later, errors)
    wait_for(lambda: writes.gathered("gpu-0") == len(later), "the binds never gathered")
    writes.release.set()
    for t in threads:
        t.join(10)
    return errors


def test_concurrent_binds_on_one_node_share_one_write_and_all_end_in_the_record(
        fake, source):
    # Before: a per-node lock held across each PUT, one PUT per bind (16 in a row).
    writes = HeldFirstWrite(source.records)
    assert held_burst(source, writes, range(1, PODS)) == {}
    assert writes.written == [{"u0"}, {f"u{i}" for i in range(PODS)}]
    assert set(fake.configmaps[RECORD]["data"]) == {f"u{i}" for i in range(PODS)}
    assert all(fake.pod("ml", f"p{i}")["spec"]["nodeName"] == "gpu-0" for i in range(PODS))


def test_a_conflicting_writer_is_merged_and_the_batch_retried(fake, source):
    """Another replica (a leader that just lost its lease) writes the record while the
    batch's write is in flight: its entry survives, and so do all of the batch's."""
    writes = HeldFirstWrite(source.records)
    errors: dict[int, str] = {}
    first = bind_all(source, [0], errors)
    assert writes.entered.wait(10)
    other = PlacementRecords(source.api, "tandem-system")
    other.load_all()  # no record yet: it creates it, so the held create answers 409
    other.write("gpu-0", "u-other", encode_entry(placement("u-other", node="gpu-0")),
                keep=lambda uid: True)
    writes.release.set()
    first[0].join(10)
    assert errors == {}
    assert set(fake.configmaps[RECORD]["data"]) == {"u0", "u-other"}
    assert writes.written[1:] == [{"u0", "u-other"}]  # read again, merged, written


def test_a_failed_write_refuses_every_bind_of_its_batch(fake, source):
    fake.inject("PUT", "/configmaps/tandem-placements-gpu-0$", 500)  # the second write
    writes = HeldFirstWrite(source.records)
    errors = held_burst(source, writes, [1, 2, 3])
    assert sorted(errors) == [1, 2, 3]
    assert all("HTTP 500" in e for e in errors.values())
    assert set(fake.configmaps[RECORD]["data"]) == {"u0"}
    assert [fake.pod("ml", f"p{i}")["spec"].get("nodeName") for i in range(4)] == \
        ["gpu-0", None, None, None]
    # the next bind writes again and goes through
    assert not bind_all(source, [1], errors)[0].join(10)
    assert set(fake.configmaps[RECORD]["data"]) == {"u0", "u1"}


def test_a_bind_whose_record_is_not_written_is_refused_and_holds_nothing():
    with cluster(nodes=1) as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("a", {"tandem.io/gpu-util": "20",
                                     "tandem.io/gpu-mem-mib": "20000"}))
        assert r.filter(c.fake, "a", ["gpu-0"])["NodeNames"] == ["gpu-0"]
        c.fake.inject("POST", "/configmaps$", 503)
        answer = r.bind("a", "gpu-0")
        assert "placement record of gpu-0: HTTP 503" in answer["Error"]
        assert c.fake.pod("ml", "a")["spec"].get("nodeName") is None
        assert ledger(r.state) == {}
        assert r.bind("a", "gpu-0") == {"Error": ""}  # the scheduler's retry
        assert set(c.fake.configmaps[RECORD]["data"]) == {"uid-a"}
