"""Placement records under kube-scheduler's concurrent binds (#28, #40): a bind waits for its
Binding only; the records are written after it, in the background, the entries of one node
batched into one write, retried until they land, and restored from the pod's signed
annotations by a restart that finds a bound pod without one.

Against the loopback API server (lab/fakes/kube_api.py), through ``KubeSource``."""

from __future__ import annotations

import threading
import time

import pytest
from extender_builders import placement, state_view
from fault_cluster import cluster, k8s_pod, ledger
from kubernetes import client

from extender.cluster.kube import KubeSource
from extender.cluster.records import PlacementRecords, encode_entry
from extender.core import PodRef
from extender.errors import SourceError
from lab.fakes import kube_api as fake_kube_api

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

    def gathered(self, writer, node: str) -> int:
        """Entries waiting for the next write of ``node``'s record."""
        with writer._cond:
            return len(writer._pending.get(node, {}))


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
    """Bind p0 and hold its record write; bind ``later`` meanwhile: every bind returns while
    the write is held, and their entries gather for the next one."""
    errors: dict[int, str] = {}
    for t in bind_all(source, [0], errors):
        t.join(10)
    assert writes.entered.wait(10)
    for t in bind_all(source, later, errors):
        t.join(10)  # the Binding only: none waits for the held record write
    wait_for(lambda: writes.gathered(source.record_writer, "gpu-0") == len(later),
             "the entries never gathered")
    writes.release.set()
    return errors


def test_binds_on_one_node_return_before_their_record_and_share_one_write(fake, source):
    # Before: each bind waited for its record write (group commit), then its Binding.
    writes = HeldFirstWrite(source.records)
    assert held_burst(source, writes, range(1, PODS)) == {}
    assert source.record_writer.flush(10)
    assert writes.written == [{"u0"}, {f"u{i}" for i in range(PODS)}]
    assert set(fake.configmaps[RECORD]["data"]) == {f"u{i}" for i in range(PODS)}
    assert all(fake.pod("ml", f"p{i}")["spec"]["nodeName"] == "gpu-0" for i in range(PODS))


def test_a_conflicting_writer_is_merged_and_the_batch_retried(fake, source):
    """Another replica (a leader that just lost its lease) writes the record while the
    batch's write is in flight: its entry survives, and so do all of the batch's."""
    writes = HeldFirstWrite(source.records)
    errors: dict[int, str] = {}
    bind_all(source, [0], errors)[0].join(10)
    assert writes.entered.wait(10)
    other = PlacementRecords(source.api, "tandem-system")
    other.load_all()  # no record yet: it creates it, so the held create answers 409
    other.write("gpu-0", "u-other", encode_entry(placement("u-other", node="gpu-0")),
                keep=lambda uid: True)
    writes.release.set()
    assert source.record_writer.flush(10)
    assert errors == {}
    assert set(fake.configmaps[RECORD]["data"]) == {"u0", "u-other"}
    assert writes.written[1:] == [{"u0", "u-other"}]  # read again, merged, written


def test_a_failed_write_is_retried_until_the_batch_lands(fake, source):
    fake.inject("PUT", "/configmaps/tandem-placements-gpu-0$", 500, times=2)  # 2nd, 3rd writes
    writes = HeldFirstWrite(source.records)
    assert held_burst(source, writes, [1, 2, 3]) == {}
    assert [fake.pod("ml", f"p{i}")["spec"].get("nodeName") for i in range(4)] == ["gpu-0"] * 4
    assert source.record_writer.flush(10)  # after two pauses of the backoff
    assert set(fake.configmaps[RECORD]["data"]) == {"u0", "u1", "u2", "u3"}
    assert source.record_writer.written == 4


def test_a_refused_binding_writes_no_record():
    with cluster(nodes=1) as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("a", {"tandem.io/gpu-util": "20",
                                     "tandem.io/gpu-mem-mib": "20000"}))
        assert r.filter(c.fake, "a", ["gpu-0"])["NodeNames"] == ["gpu-0"]
        c.fake.inject("POST", "/binding$", 403)
        assert "403" in r.bind("a", "gpu-0")["Error"]
        assert r.source.record_writer.flush(5)
        assert ledger(r.state) == {} and RECORD not in c.fake.configmaps
        assert r.bind("a", "gpu-0") == {"Error": ""}  # the scheduler's retry
        assert r.source.record_writer.flush(5)
        assert set(c.fake.configmaps[RECORD]["data"]) == {"uid-a"}


@pytest.mark.parametrize("edited", [False, True], ids=["as-bound", "edited-in-the-window"])
def test_a_crash_between_binding_and_record_loses_nothing(edited):
    """The record write never lands (the API refuses it) and the extender is replaced: the
    new one takes the pod's placement from its signed annotations and writes the record
    back. An owner's edit inside that window breaks the signature: the pod then holds its
    whole node (the safe side), with an event."""
    with cluster(nodes=1) as c:
        r = c.replica()
        c.fake.put_pod(k8s_pod("a", {"tandem.io/gpu-util": "20",
                                     "tandem.io/gpu-mem-mib": "20000"}))
        assert r.filter(c.fake, "a", ["gpu-0"])["NodeNames"] == ["gpu-0"]
        refusing = c.fake.inject("POST", "/configmaps$", 503, times=1000)
        assert r.bind("a", "gpu-0") == {"Error": ""}
        held = ledger(r.state)
        assert not r.source.record_writer.flush(0.5) and RECORD not in c.fake.configmaps
        r.source.record_writer.stop(0)  # the process dies with the entry queued
        if edited:
            pod = c.fake.pod("ml", "a")
            pod["metadata"]["annotations"]["tandem.io/gpu-index"] = "1"
            c.fake.put_pod(pod)
        refusing.times = 0
        restarted = c.replica()
        assert restarted.source.record_writer.flush(5)
        gpus = [g["reserved_mib"] for g in state_view(restarted.state)["nodes"]["gpu-0"]["gpus"]]
        if edited:
            assert gpus == [40960, 40960] and state_view(restarted.state)["untrusted"] == 1
            assert RECORD not in c.fake.configmaps
        else:
            assert ledger(restarted.state) == held and sorted(gpus) == [0, 20000]
            assert set(c.fake.configmaps[RECORD]["data"]) == {"uid-a"}
            assert state_view(restarted.state)["untrusted"] == 0


def test_stopping_writes_what_is_queued(fake, source):
    """SIGTERM's shutdown stops the source: entries still queued are written first."""
    writes = HeldFirstWrite(source.records)
    errors: dict[int, str] = {}
    bind_all(source, [0], errors)[0].join(10)
    assert writes.entered.wait(10)
    for t in bind_all(source, [1, 2], errors):
        t.join(10)
    threading.Timer(0.2, writes.release.set).start()
    source.stop()
    assert errors == {} and source.record_writer.pending() == 0
    assert set(fake.configmaps[RECORD]["data"]) == {"u0", "u1", "u2"}


def test_nothing_is_sent_once_stop_returns(fake, source):
    """The crash the test above plays: stop returns only once the write already sent has its
    answer, and no worker takes another one after it (a worker slower than the join used to
    stay alive and write the record once the API server took writes again)."""
    refusing = fake.inject("POST", "/configmaps$", 503, times=1000)
    real, calls = source.records.write_batch, []
    entered, answered = threading.Event(), threading.Event()

    def slow_write(*args):
        calls.append(args)
        if len(calls) == 1:
            entered.set()
            time.sleep(1.5)  # longer than stop's join of a worker
        try:
            real(*args)
        finally:
            answered.set()
    source.records.write_batch = slow_write
    errors: dict[int, str] = {}
    bind_all(source, [0], errors)[0].join(10)
    assert entered.wait(10) and errors == {}
    source.record_writer.stop(0)
    assert answered.is_set()  # the write in flight was answered (refused) before stop returned
    sent = len(calls)
    refusing.times = 0
    time.sleep(0.5)  # past the first retry pause (0.2 s) of a worker still running
    assert len(calls) == sent and RECORD not in fake.configmaps
    assert source.record_writer.pending() == 1  # still queued, as in a process that died
