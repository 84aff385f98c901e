"""The tandem.io/gpu device plugin: pure hand-off decisions, CDI, health, and the real
gRPC conversation with a kubelet stand-in on unix sockets (registration, ListAndWatch,
Allocate, preferred allocation, re-registration after a kubelet restart, and concurrent
admissions with the extender's hand-off gate)."""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from agent.device_plugin import protocol as api
from agent.device_plugin.assign import (
    Candidate,
    Gpu,
    Refusal,
    candidates,
    choose,
    grant,
    preferred,
    share_ids,
    uuid_of,
)
from agent.device_plugin.cdi import cdi_device_names
from agent.device_plugin.health import HealthTracker
from agent.device_plugin.server import (
    DevicePluginRunner,
    DevicePluginService,
    PluginConfig,
    PodResourcesUnavailable,
    pod_resources_holding,
)
from agent.errors import DriverNotLoaded
from agent.node.gpus import GpuInfo, GpuSample, NodeSample
from extender.state.handoff import HandoffGate

G0, G1 = Gpu(0, "GPU-aaaa"), Gpu(1, "GPU-bbbb")
INVENTORY = {G0.uuid: G0, G1.uuid: G1}


def placement(ns: str, name: str, uid: str, *gpus: Gpu, container: str | None = None,
              state: str = "placed") -> list[tuple]:
    return [(ns, name, uid, g.index, g.uuid, container, state) for g in gpus]


# --- pure decisions -------------------------------------------------------------

def test_share_ids_round_trip_to_their_gpu():
    ids = share_ids(G0, 3)
    assert ids == ["GPU-aaaa::0", "GPU-aaaa::1", "GPU-aaaa::2"]
    assert {uuid_of(i) for i in ids} == {G0.uuid}


def test_candidates_group_a_pods_gpus_and_skip_pods_holding_devices():
    rows = placement("ml", "train", "u1", G1, G0) + placement("ml", "old", "u2", G0)
    got = candidates(rows, INVENTORY, holding={"ml/old": {"main"}})
    assert got == [Candidate("ml/train", "u1", (G0, G1))]


def test_candidates_ignore_gpus_this_node_does_not_have():
    rows = placement("ml", "x", "u1", Gpu(7, "GPU-gone"))
    assert candidates(rows, INVENTORY, holding={}) == []


@pytest.mark.parametrize(("pods", "count", "want"), [
    pytest.param([Candidate("a/p", "1", (G0,))], 1, "a/p", id="one-waiting-pod"),
    pytest.param([Candidate("a/p", "1", (G0,)), Candidate("a/q", "2", (G0,))], 1, "a/p",
                 id="same-gpus-either-is-right"),
    pytest.param([Candidate("a/p", "1", (G0,)), Candidate("a/q", "2", (G0, G1))], 2,
                 "a/q", id="count-tells-them-apart"),
    pytest.param([Candidate("a/p", "1", (G0,)), Candidate("a/q", "2", (G1,))], 1,
                 "Ambiguous", id="different-gpus-same-count-refused"),
    pytest.param([], 1, "NoAssignment", id="nobody-waiting"),
    pytest.param([Candidate("a/p", "1", (G0,))], 2, "NoAssignment", id="wrong-count"),
])
def test_choose_the_pod_being_admitted(pods, count, want):
    got = choose(pods, count, "node-1")
    assert (got.reason if isinstance(got, Refusal) else got.key) == want


def test_preferred_allocation_puts_the_bound_gpus_shares_first():
    available = share_ids(G0, 2) + share_ids(G1, 2)
    assert preferred(available, [], 1, [G1.uuid]) == ["GPU-bbbb::0"]
    assert preferred(available, [], 2, [G0.uuid, G1.uuid]) == ["GPU-aaaa::0", "GPU-bbbb::0"]
    assert preferred(available, ["GPU-aaaa::1"], 2, [G1.uuid]) == ["GPU-aaaa::1", "GPU-bbbb::0"]


def test_grant_uses_cdi_names_only_when_the_node_can_resolve_them():
    pod = Candidate("ml/p", "uid-1", (G0, G1))
    with_cdi = grant(pod, {"nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb"})
    assert with_cdi.cdi_devices == ("nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=GPU-bbbb")
    assert with_cdi.device_nodes == ()
    # The image's NVIDIA_VISIBLE_DEVICES=all must not add GPUs on top of CDI.
    assert with_cdi.envs == (("NVIDIA_VISIBLE_DEVICES", "void"),)
    partial = grant(pod, {"nvidia.com/gpu=GPU-aaaa"})
    assert partial.cdi_devices == ()
    assert partial.device_nodes[:2] == ("/dev/nvidia0", "/dev/nvidia1")
    assert "/dev/nvidiactl" in partial.device_nodes
    assert dict(partial.envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"


def test_cdi_names_are_read_from_yaml_and_json_specs(tmp_path):
    (tmp_path / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: '0'\n"
        "  - name: GPU-aaaa\n  - name: all\n")
    (tmp_path / "other.json").write_text(json.dumps(
        {"cdiVersion": "0.5.0", "kind": "vendor.com/x", "devices": [{"name": "d"}]}))
    (tmp_path / "broken.yaml").write_text("kind: [unclosed")
    assert cdi_device_names([tmp_path, tmp_path / "missing"]) == {
        "nvidia.com/gpu=0", "nvidia.com/gpu=GPU-aaaa", "nvidia.com/gpu=all", "vendor.com/x=d"}


# --- health ---------------------------------------------------------------------

class ScriptedSource:
    """A GPU source whose inventory and XID counters the test sets."""

    def __init__(self) -> None:
        self.infos = [GpuInfo(0, G0.uuid, "H100", 81559), GpuInfo(1, G1.uuid, "H100", 81559)]
        self.xids = {G0.uuid: (0, 0), G1.uuid: (0, 0)}
        self.lost: set[str] = set()
        self.down = False

    def inventory(self):
        if self.down:
            raise DriverNotLoaded("driver gone")
        return list(self.infos)

    def sample(self, interval_seconds):
        return NodeSample(0.0, interval_seconds, tuple(
            GpuSample(i, 0, 0.0, None, None, None, self.xids[i.uuid][0],
                      self.xids[i.uuid][1], lost=i.uuid in self.lost) for i in self.infos))


def health_of(tracker: HealthTracker) -> dict[int, bool]:
    return {g.index: g.healthy for g in tracker.gpus().values()}


def test_health_fatal_xid_is_sticky_and_application_xids_are_not():
    source = ScriptedSource()
    tracker = HealthTracker(source)
    tracker.poll()
    assert health_of(tracker) == {0: True, 1: True}
    source.xids[G0.uuid] = (1, 43)  # an application fault (GPU stopped processing)
    tracker.poll()
    assert health_of(tracker) == {0: True, 1: True}
    source.xids[G1.uuid] = (1, 79)  # GPU has fallen off the bus
    version = tracker.version()
    tracker.poll()
    assert health_of(tracker) == {0: True, 1: False}
    assert tracker.version() != version
    tracker.poll()  # nothing new: still unhealthy
    assert health_of(tracker) == {0: True, 1: False}


def test_health_lost_or_vanished_gpus_and_a_dead_driver():
    source = ScriptedSource()
    tracker = HealthTracker(source)
    tracker.poll()
    source.lost.add(G0.uuid)
    tracker.poll()
    assert health_of(tracker) == {0: False, 1: True}
    source.infos = source.infos[:1]  # GPU 1 vanished from the inventory
    tracker.poll()
    assert health_of(tracker) == {0: False, 1: False}
    source2 = ScriptedSource()
    tracker2 = HealthTracker(source2)
    tracker2.poll()
    source2.down = True
    tracker2.poll()
    assert health_of(tracker2) == {0: False, 1: False}


# --- gRPC with a kubelet stand-in -------------------------------------------------

class FakeKubelet:
    """Registration on kubelet.sock and the pod resources List, recording what it got."""

    def __init__(self, plugin_dir: Path, pod_resources: Path) -> None:
        self.plugin_dir, self.pod_resources_socket = plugin_dir, pod_resources
        self.registrations: list = []
        self.holding: list[tuple[str, str, list[str]]] = []
        self.server: grpc.Server | None = None
        self.start()

    def start(self) -> None:
        kubelet = self

        class Registration:
            def Register(self, request, context):
                kubelet.registrations.append(request)
                return api.Empty()

        class PodResources:
            def List(self, request, context):
                response = api.ListPodResourcesResponse()
                for ns, name, ids in list(kubelet.holding):
                    pod = response.pod_resources.add(namespace=ns, name=name)
                    pod.containers.add(name="main").devices.add(
                        resource_name="tandem.io/gpu", device_ids=ids)
                return response

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api.add_registration_to_server(Registration(), self.server)
        api.add_pod_resources_to_server(PodResources(), self.server)
        self.server.add_insecure_port(f"unix://{self.plugin_dir / api.KUBELET_SOCKET}")
        self.server.add_insecure_port(f"unix://{self.pod_resources_socket}")
        self.server.start()

    def restart(self) -> None:
        """What a kubelet restart does to the directory: every socket in it goes."""
        assert self.server is not None
        self.server.stop(0).wait()
        for sock in self.plugin_dir.glob("*.sock"):
            sock.unlink()
        self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def plugin(tmp_path):
    plugin_dir = tmp_path / "dp"
    plugin_dir.mkdir()
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    kubelet = FakeKubelet(plugin_dir, tmp_path / "pr.sock")
    source = ScriptedSource()
    rows: list[tuple] = []
    stop = threading.Event()
    config = PluginConfig(node="node-1", plugin_dir=plugin_dir, shares_per_gpu=4,
                          health_interval_seconds=0.1, assignment_retry_seconds=0.3)
    service = DevicePluginService(
        config, HealthTracker(source), lambda: list(rows),
        lambda: pod_resources_holding(kubelet.pod_resources_socket, "tandem.io/gpu"),
        lambda: cdi_device_names([cdi_dir]), stop)
    runner = DevicePluginRunner(service, stop)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    assert wait_for(lambda: runner.registrations == 1 and runner.socket.exists())
    channel = grpc.insecure_channel(f"unix://{runner.socket}")

    def call(method, request, **kw):
        return channel.unary_unary(f"/{api.DEVICE_PLUGIN_SERVICE}/{method}",
                                   **api.serializers(api.DEVICE_PLUGIN_SERVICE, method))(
            request, timeout=5, **kw)

    yield {"kubelet": kubelet, "source": source, "rows": rows, "runner": runner,
           "call": call, "channel": channel, "cdi_dir": cdi_dir, "stop": stop}
    stop.set()
    thread.join(timeout=10)
    channel.close()
    kubelet.stop()


def test_registers_the_resource_with_the_kubelet(plugin):
    request = plugin["kubelet"].registrations[0]
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1", "tandem-gpu.sock", "tandem.io/gpu")
    assert request.options.get_preferred_allocation_available is True
    options = plugin["call"]("GetDevicePluginOptions", api.Empty())
    assert (options.pre_start_required, options.get_preferred_allocation_available) == (
        False, True)


def test_list_and_watch_advertises_shares_and_streams_health_changes(plugin):
    stream = plugin["channel"].unary_stream(
        f"/{api.DEVICE_PLUGIN_SERVICE}/ListAndWatch",
        **api.serializers(api.DEVICE_PLUGIN_SERVICE, "ListAndWatch"))(api.Empty(), timeout=10)
    first = next(stream)
    assert len(first.devices) == 8
    assert {d.health for d in first.devices} == {"Healthy"}
    plugin["source"].xids[G1.uuid] = (1, 79)
    second = next(stream)
    sick = {d.ID for d in second.devices if d.health == "Unhealthy"}
    assert sick == set(share_ids(G1, 4))
    stream.cancel()


def allocate(plugin, *device_ids):
    request = api.AllocateRequest()
    request.container_requests.add(devices_ids=list(device_ids))
    return plugin["call"]("Allocate", request)


def test_allocate_hands_over_the_bound_gpu_by_cdi_name(plugin):
    (plugin["cdi_dir"] / "nvidia.yaml").write_text(
        "kind: nvidia.com/gpu\ndevices: [{name: GPU-aaaa}, {name: GPU-bbbb}]\n")
    plugin["rows"].extend(placement("ml", "serve", "uid-1", G1))
    # The kubelet picked a share of GPU 0; the pod was bound to GPU 1, and gets GPU 1.
    response = allocate(plugin, "GPU-aaaa::3")
    container = response.container_responses[0]
    assert [d.name for d in container.cdi_devices] == ["nvidia.com/gpu=GPU-bbbb"]
    assert dict(container.annotations)["tandem.io/pod-uid"] == "uid-1"
    assert len(container.devices) == 0
    assert dict(container.envs) == {"NVIDIA_VISIBLE_DEVICES": "void"}


def test_allocate_without_cdi_gives_device_nodes_and_plugin_set_environment(plugin):
    plugin["rows"].extend(placement("ml", "train", "uid-2", G0, G1))
    container = allocate(plugin, "GPU-aaaa::0", "GPU-bbbb::0").container_responses[0]
    assert [d.host_path for d in container.devices][:2] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert dict(container.envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa,GPU-bbbb"


def test_allocate_refuses_a_pod_tandem_did_not_bind(plugin):
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, "GPU-aaaa::0")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "NoAssignment" in err.value.details()


def test_allocate_skips_pods_that_already_hold_devices(plugin):
    plugin["rows"].extend(placement("ml", "running", "uid-3", G0)
                          + placement("ml", "new", "uid-4", G1))
    plugin["kubelet"].holding.append(("ml", "running", ["GPU-aaaa::0"]))
    container = allocate(plugin, "GPU-aaaa::1").container_responses[0]
    assert dict(container.annotations)["tandem.io/pod-uid"] == "uid-4"


def test_allocate_refuses_ambiguity_and_unhealthy_gpus(plugin):
    plugin["rows"].extend(placement("ml", "a", "uid-5", G0) + placement("ml", "b", "uid-6", G1))
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, "GPU-aaaa::0")
    assert "Ambiguous" in err.value.details()
    plugin["rows"].clear()
    plugin["rows"].extend(placement("ml", "c", "uid-7", G1))
    plugin["source"].xids[G1.uuid] = (1, 79)
    assert wait_for(lambda: not plugin["runner"].service.health.gpus()[G1.uuid].healthy)
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, "GPU-bbbb::0")
    assert "Unhealthy" in err.value.details()


def test_preferred_allocation_steers_the_kubelet_to_the_bound_gpu(plugin):
    plugin["rows"].extend(placement("ml", "serve", "uid-8", G1))
    request = api.PreferredAllocationRequest()
    request.container_requests.add(available_deviceIDs=share_ids(G0, 4) + share_ids(G1, 4),
                                   allocation_size=1)
    response = plugin["call"]("GetPreferredAllocation", request)
    assert list(response.container_responses[0].deviceIDs) == ["GPU-bbbb::0"]


def test_registers_again_after_a_kubelet_restart(plugin):
    plugin["kubelet"].restart()
    runner = plugin["runner"]
    assert wait_for(lambda: runner.registrations == 2 and runner.socket.exists())
    assert len(plugin["kubelet"].registrations) == 2
    options = plugin["call"]("GetDevicePluginOptions", api.Empty())
    assert options.get_preferred_allocation_available is True


def test_pod_resources_api_missing_is_reported(tmp_path):
    with pytest.raises(PodResourcesUnavailable):
        pod_resources_holding(tmp_path / "nope.sock", "tandem.io/gpu")


# --- concurrent admissions --------------------------------------------------------

def add_gpus(plugin, count: int) -> list[Gpu]:
    """Grow the scripted node to ``count`` GPUs and wait until the plugin sees them."""
    source = plugin["source"]
    gpus = [Gpu(i, f"GPU-{i:04d}") for i in range(count)]
    source.infos = [GpuInfo(g.index, g.uuid, "H100", 81559) for g in gpus]
    source.xids = {g.uuid: (0, 0) for g in gpus}
    health = plugin["runner"].service.health
    assert wait_for(lambda: {g.uuid for g in health.gpus().values() if g.healthy}
                    == {g.uuid for g in gpus})
    return gpus


def admit(plugin, ns: str, name: str, device_ids: list[str]) -> list[str]:
    """What the kubelet does for one pod: Allocate, then record the devices it holds
    (the pod resources API lists them from then on). The GPUs the container got."""
    container = allocate(plugin, *device_ids).container_responses[0]
    plugin["kubelet"].holding.append((ns, name, list(device_ids)))
    return dict(container.annotations)["tandem.io/gpu-uuid"].split(",")


def run_threads(work, items) -> dict:
    """Run ``work(item)`` for every item at once, started together; item -> result."""
    start = threading.Barrier(len(items))
    results: dict = {}

    def one(item):
        start.wait()
        try:
            results[item] = work(item)
        except grpc.RpcError as err:
            results[item] = err.details()

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_allocates_each_get_their_own_gpus(plugin):
    """Pods waiting at once are told apart by GPU count; the kubelet's chosen share IDs
    (here deliberately on other GPUs) do not change what each container gets."""
    g = add_gpus(plugin, 6)
    bound = {"a": [g[0]], "b": [g[1], g[2]], "c": [g[3], g[4], g[5]]}
    for name, gpus in bound.items():
        plugin["rows"].extend(placement("ml", name, f"uid-{name}", *gpus))
    kubelet_pick = {"a": [f"{g[5].uuid}::0"],
                    "b": [f"{g[0].uuid}::1", f"{g[3].uuid}::1"],
                    "c": [f"{g[1].uuid}::2", f"{g[2].uuid}::2", f"{g[0].uuid}::2"]}
    got = run_threads(lambda name: admit(plugin, "ml", name, kubelet_pick[name]), list(bound))
    assert got == {name: [x.uuid for x in gpus] for name, gpus in bound.items()}
    # Every pod now holds devices: nobody is waiting any more.
    with pytest.raises(grpc.RpcError) as err:
        allocate(plugin, f"{g[0].uuid}::3")
    assert "NoAssignment" in err.value.details()


def test_gated_concurrent_admissions_of_same_sized_pods_each_get_their_own_gpu(plugin):
    """Four one-GPU pods bound to four GPUs of one node, admitted from four threads. The
    extender's hand-off gate lets one pod at a time wait on the node (the others see
    HandoffPending and retry), so every Allocate has exactly one candidate."""
    g = add_gpus(plugin, 4)
    gate = HandoffGate(time.monotonic)
    pending_seen: list[str] = []

    def schedule_and_admit(i: int) -> list[str]:
        name, uid = f"p{i}", f"uid-p{i}"
        while (holder := gate.claim("node-1", uid, f"ml/{name}", 30.0)) is not None:
            pending_seen.append(f"{name} waits for {holder.pod}")  # Filter: HandoffPending
            time.sleep(0.01)
        plugin["rows"].extend(placement("ml", name, uid, g[i]))  # the bind
        try:
            return admit(plugin, "ml", name, [f"{g[(i + 1) % 4].uuid}::0"])
        finally:
            gate.release(uid)  # the kubelet set status.startTime

    got = run_threads(schedule_and_admit, list(range(4)))
    assert got == {i: [g[i].uuid] for i in range(4)}
    assert pending_seen  # the gate did hold pods back
    assert gate.waiting() == {}


def test_two_same_sized_pods_pending_on_different_gpus_are_refused_not_guessed(plugin):
    """Without the gate (or with the env hand-off's binds), two one-GPU pods on
    different GPUs may wait at once: every Allocate answers Ambiguous and no container
    gets a GPU the extender did not bind. The gate keeps the second pod off the node."""
    plugin["rows"].extend(placement("ml", "x", "uid-x", G0) + placement("ml", "y", "uid-y", G1))
    got = run_threads(lambda name: admit(plugin, "ml", name, ["GPU-aaaa::0"]), ["x", "y"])
    assert all("tandem Ambiguous" in str(answer) for answer in got.values()), got
    assert plugin["kubelet"].holding == []

    plugin["rows"].clear()
    gate = HandoffGate(time.monotonic)
    assert gate.claim("node-1", "uid-x", "ml/x", 30.0) is None
    plugin["rows"].extend(placement("ml", "x", "uid-x", G0))
    assert gate.claim("node-1", "uid-y", "ml/y", 30.0).pod == "ml/x"  # HandoffPending
    assert admit(plugin, "ml", "x", ["GPU-bbbb::0"]) == [G0.uuid]
    gate.release("uid-x")
    assert gate.claim("node-1", "uid-y", "ml/y", 30.0) is None
    plugin["rows"].extend(placement("ml", "y", "uid-y", G1))
    assert admit(plugin, "ml", "y", ["GPU-aaaa::1"]) == [G1.uuid]
