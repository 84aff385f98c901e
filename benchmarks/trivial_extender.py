"""The baseline for extender_latency.py: the least a GPU-memory extender can do.

Flask on cheroot (the same server as tandem's), nodes and bound pods listed once
through the official ``kubernetes`` client, then per call: filter passes the
candidates with a GPU whose free memory covers the pod's ``tandem.io/gpu-mem-mib``,
prioritize answers 0 for every candidate, and bind takes the freest GPU's memory
and creates ``pods/binding`` (with the pod UID) through the same client. No
prediction, no co-location model, no annotations, no events: what is left is the
cost of HTTP, JSON and the Kubernetes client, which is what tandem is compared to.

Its client (:func:`kube_client`) has the connection pool sized as tandem's official client
(``kube_http.pooled``): with the default (``cpu_count() * 5``, 10 on 2 cores) every burst of
16 binds opens connections and drops them, with a "Connection pool is full" warning
each time, which any author would fix by setting the same ``connection_pool_maxsize``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cheroot import wsgi
from flask import Flask, jsonify, request
from kubernetes import client

from contracts.httpserve import KEEP_ALIVE_CONNECTIONS
from extender.cluster.kube_http import pooled
from extender.transport.server import LISTEN_BACKLOG

REASON = "not enough free GPU memory"


def kube_client(port: int) -> client.CoreV1Api:
    """The official client on the API server at 127.0.0.1:``port``, its pool sized for
    concurrent binds (built after fork: pools are per process)."""
    return client.CoreV1Api(pooled(client.Configuration(host=f"http://127.0.0.1:{port}")))


def _free_memory(api: client.CoreV1Api) -> dict[str, list[float]]:
    """Free MiB per GPU of every node, from GFD labels minus bound pods' recorded memory."""
    free: dict[str, list[float]] = {}
    for node in json.loads(api.list_node(_preload_content=False).data)["items"]:
        labels = node["metadata"].get("labels") or {}
        count = int(labels.get("nvidia.com/gpu.count", "0"))
        free[node["metadata"]["name"]] = [float(labels.get("nvidia.com/gpu.memory", "0"))] * count
    pods = json.loads(api.list_pod_for_all_namespaces(
        field_selector="spec.nodeName!=", _preload_content=False).data)["items"]
    for pod in pods:
        ann = pod["metadata"].get("annotations") or {}
        gpus = free.get(pod["spec"]["nodeName"])
        if gpus and "tandem.io/gpu-index" in ann:
            gpus[int(ann["tandem.io/gpu-index"])] -= float(ann["tandem.io/predicted-gpu-mem-mib"])
    return free


def _need(pod: Mapping[str, Any]) -> float:
    return float(((pod.get("metadata") or {}).get("annotations") or {})
                 .get("tandem.io/gpu-mem-mib", "0"))


def create_trivial_app(api: client.CoreV1Api) -> Flask:
    """The trivial extender's WSGI app over ``api``."""
    free = _free_memory(api)
    needs: dict[str, float] = {}  # pod UID -> MiB, seen at filter (bind gets no pod)
    lock = threading.Lock()
    app = Flask("trivial-extender")

    @app.post("/filter")
    def filter_() -> Any:
        body = request.get_json()
        need = _need(body["Pod"])
        needs[body["Pod"]["metadata"]["uid"]] = need
        passed, failed = [], {}
        for name in body["NodeNames"]:
            if max(free.get(name) or [0.0]) >= need:
                passed.append(name)
            else:
                failed[name] = REASON
        return jsonify({"NodeNames": passed, "FailedNodes": failed, "Error": ""})

    @app.post("/prioritize")
    def prioritize() -> Any:
        return jsonify([{"Host": name, "Score": 0} for name in request.get_json()["NodeNames"]])

    @app.post("/bind")
    def bind() -> Any:
        body = request.get_json()
        node, need = body["Node"], needs.get(body["PodUID"], 0.0)
        with lock:
            gpus = free.get(node) or []
            best = max(range(len(gpus)), key=gpus.__getitem__, default=None)
            if best is None or gpus[best] < need:
                return jsonify({"Error": f"{node}: {REASON}"})
            gpus[best] -= need
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=body["PodName"], uid=body["PodUID"]),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        try:
            answer = api.create_namespaced_pod_binding(
                body["PodName"], body["PodNamespace"], binding, _preload_content=False)
            answer.read()  # drain the Status so the keep-alive connection can be reused
        except client.ApiException as exc:
            with lock:
                gpus[best] += need
            return jsonify({"Error": f"bind failed: {exc.status} {exc.reason}"})
        return jsonify({"Error": ""})

    return app


def serve(app: Flask, threads: int = 8) -> tuple[int, Callable[[], None]]:
    """Serve ``app`` with cheroot on 127.0.0.1 in a daemon thread: (port, stop)."""
    # tandem's listen backlog and keep-alive limit: the comparison is of the work per call
    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=threads,
                         server_name="trivial-extender", request_queue_size=LISTEN_BACKLOG)
    server.keep_alive_conn_limit = KEEP_ALIVE_CONNECTIONS
    server.prepare()
    thread = threading.Thread(target=server.serve, name="trivial-extender", daemon=True)
    thread.start()

    def stop() -> None:
        server.stop()
        thread.join(timeout=10)
    return int(server.bind_addr[1]), stop
