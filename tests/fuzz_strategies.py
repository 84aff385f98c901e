"""Hypothesis strategies for every POST body tandem serves, and the property they must keep.

Shared by the fuzz tests and ``benchmarks/fault_injection.py`` (no tests here). A
:class:`Harness` builds the three HTTP servers in process, each over its real
app: the extender (sim cluster), the inference server (sim executor, one SLO and
one best-effort session) and the session proxy (forwarding to that server). Each
:class:`Target` is one endpoint with a strategy of :class:`Req` (body bytes and
headers, malformed ones included). :func:`problems` states the property: no 5xx,
no traceback, every 4xx carries a reason, and a rejected request changes no state.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from extender_builders import AGENT_AUTH, TOKEN, make_app
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from server_helpers import running_tiny_runtime

from agent.inference.http.app import create_app as server_app
from agent.session.http import ProxyConfig, create_proxy_app
from agent.session.proxy import SessionLink, session_request

NPY = "application/x-npy"
ANNOTATION_KEYS = ["tandem.io/gpu-util", "tandem.io/gpu-mem-mib", "tandem.io/workload",
                   "tandem.io/model", "tandem.io/batch-size", "tandem.io/slo-ms",
                   "tandem.io/rate-rps", "tandem.io/weight", "tandem.io/priority",
                   "tandem.io/gpu-index", "tandem.io/predicted-gpu-mem-mib"]


def fuzz_settings(max_examples: int, shrink: bool = True, derandomize: bool = False,
                  ) -> settings:
    """Settings for one endpoint's run: no deadline (2 shared cores), no example database;
    ``shrink=False`` reports the first failure as found (cheaper for known failures);
    ``derandomize`` draws the same cases every run (the benchmark's figures repeat)."""
    phases = list(Phase) if shrink else [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(max_examples=max_examples, deadline=None, database=None, phases=phases,
                    derandomize=derandomize, suppress_health_check=list(HealthCheck))


# ---- values ---------------------------------------------------------------------------
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
           | st.sampled_from(["", "-1", "1e309", "²", "NaN", "0x10", " 5 ", "5000", "+5"]))
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                        max_size=4),
    max_leaves=12)
annotations = st.dictionaries(st.sampled_from(ANNOTATION_KEYS),
                              st.text(max_size=6) | st.sampled_from(["20", "5000", "inference",
                                                                     "training", "m.onnx"]),
                              max_size=5)
pods = st.fixed_dictionaries({"metadata": st.fixed_dictionaries({
    "name": st.text(min_size=1, max_size=5), "namespace": st.sampled_from(["ml", "", "a/b"]),
    "uid": st.text(max_size=6), "annotations": annotations | json_values}),
    "spec": json_values})

# Adversarial bodies every endpoint gets on top of its own shapes.
raw_bytes = st.binary(max_size=64)
hostile = st.sampled_from([
    b"", b"{", b"null", b"[]", b"\xff\xfe{}", b'{"a": NaN}', b'{"a": Infinity}',
    b"\xef\xbb\xbf{}", b'"\\ud800"', b"[" * 100 + b"]" * 100])
deep = st.integers(1_000, 100_000).map(lambda n: b"[" * n + b"]" * n)
huge_number = st.integers(500, 20_000).map(lambda n: b'{"x": ' + b"9" * n + b"}")


def encoded(values: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """JSON bytes of ``values``."""
    return values.map(lambda v: json.dumps(v).encode())


# ---- headers --------------------------------------------------------------------------
content_types = st.sampled_from(["application/json", NPY, "text/plain", "",
                                 "application/json; charset=latin-1", "multipart/form-data",
                                 "application/x-npy; x=1", "\u00e9/\u00e9"])
authorization = st.sampled_from([None, f"Bearer {TOKEN}", "Bearer wrong", f"Basic {TOKEN}",
                                 "Bearer", "bearer  " + TOKEN, "Bearer " + "a" * 10_000])
content_lengths = st.sampled_from([None, "-5", "abc", "99999999999999999999", "1e3", " 12",
                                   "0", "+3"])


@dataclass(frozen=True)
class Req:
    """One request: body, headers, and a raw Content-Length override (None: the real one)."""

    body: bytes
    content_type: str = "application/json"
    authorization: str | None = None
    content_length: str | None = None
    path: str = ""


def requests(bodies: st.SearchStrategy[bytes], default_type: str, default_auth: str | None,
             paths: st.SearchStrategy[str], headers: bool = False) -> st.SearchStrategy[Req]:
    """Requests with ``bodies`` (plus raw and hostile ones); with ``headers``, Content-Type,
    Authorization and Content-Length are fuzzed too (each right half of the time)."""
    body = st.one_of(bodies, bodies, raw_bytes, hostile)
    if not headers:
        return st.builds(Req, body, st.just(default_type), st.just(default_auth), st.none(), paths)
    return st.builds(Req, body, st.one_of(st.just(default_type), content_types),
                     st.one_of(st.just(default_auth), authorization),
                     st.one_of(st.none(), content_lengths), paths)


def adversarial(default_type: str, default_auth: str | None, paths: st.SearchStrategy[str],
                ) -> st.SearchStrategy[Req]:
    """Only the bodies a hardened parser must refuse cheaply: deep nesting, huge numbers."""
    return st.builds(Req, st.one_of(deep, huge_number), st.just(default_type),
                     st.just(default_auth), st.none(), paths)


# ---- endpoint bodies ------------------------------------------------------------------
def extender_args() -> st.SearchStrategy[bytes]:
    """ExtenderArgs (NodeNames or Nodes) with fuzzed pods and candidates."""
    names = st.lists(st.sampled_from(["n1", "n2", "ghost", ""]) | st.text(max_size=4),
                     max_size=4)
    nodes = st.fixed_dictionaries({"items": st.lists(
        st.fixed_dictionaries({"metadata": st.fixed_dictionaries({"name": st.text(max_size=3)})}),
        max_size=3)})
    return encoded(st.one_of(
        json_values, st.fixed_dictionaries({"Pod": pods | json_values, "NodeNames": names}),
        st.fixed_dictionaries({"Pod": pods, "Nodes": nodes | json_values})))


def binding_args() -> st.SearchStrategy[bytes]:
    """ExtenderBindingArgs with fuzzed fields."""
    text = st.text(max_size=6) | json_values
    return encoded(st.one_of(json_values, st.fixed_dictionaries(
        {"PodName": text, "PodNamespace": text, "PodUID": text,
         "Node": st.sampled_from(["n1", "n2", "ghost"]) | text})))


def preemption_args() -> st.SearchStrategy[bytes]:
    """ExtenderPreemptionArgs in both victim forms."""
    victims = st.dictionaries(st.sampled_from(["n1", "n2", "x"]), st.fixed_dictionaries(
        {"Pods": st.lists(st.fixed_dictionaries({"metadata": json_values}) | json_values,
                          max_size=2), "NumPDBViolations": json_values}), max_size=2)
    meta = st.dictionaries(st.sampled_from(["n1", "n2"]), st.fixed_dictionaries(
        {"Pods": st.lists(st.fixed_dictionaries({"UID": json_values}), max_size=2)}), max_size=2)
    return encoded(st.one_of(json_values, st.fixed_dictionaries(
        {"Pod": pods | json_values, "NodeNameToVictims": victims | json_values}),
        st.fixed_dictionaries({"Pod": pods, "NodeNameToMetaVictims": meta})))


def agent_reports() -> st.SearchStrategy[bytes]:
    """Agent reports: mostly well formed per GPU, with fuzzed values and fields."""
    number = st.floats(-1e12, 1e12, allow_nan=False) | st.integers(-2**65, 2**65) | scalars
    gpu = st.fixed_dictionaries({
        "index": st.integers(-2, 70) | scalars, "uuid": st.sampled_from(["GPU-0", "GPU-1", ""])
        | st.text(max_size=4), "product": st.sampled_from(["NVIDIA A100-SXM4-40GB", ""]),
        "memory_total_mib": number, "memory_used_mib": number, "utilization_percent": number,
        "processes": st.lists(st.fixed_dictionaries({"pod_uid": json_values,
                                                     "used_memory_mib": number}), max_size=2)
        | json_values})
    return encoded(st.one_of(json_values, st.fixed_dictionaries({
        "node": st.sampled_from(["n1", "n2", "ghost"]) | json_values,
        "timestamp": number, "interval_seconds": number,
        "gpus": st.lists(gpu, max_size=3) | json_values})))


def session_bodies() -> st.SearchStrategy[bytes]:
    """``POST /v1/sessions`` bodies: SLO and best-effort shapes with fuzzed fields."""
    number = st.floats(-1e9, 1e9, allow_nan=False) | st.integers(-2**65, 2**65) | scalars
    name = st.text(max_size=8) | st.sampled_from(["s", "be", "fz-1"]) | json_values
    model = st.sampled_from(["tiny", "heavy", "", "../x"]) | json_values
    return encoded(st.one_of(json_values, st.fixed_dictionaries(
        {"name": name, "model": model, "slo_ms": number, "rate_rps": number}),
        st.fixed_dictionaries({"name": name, "model": model},
                              optional={"weight": number, "priority": number, "x": scalars})))


def infer_json() -> st.SearchStrategy[bytes]:
    """``{"inputs": {NAME: nested list}}`` and near misses."""
    cell = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2**70, 2**70) | scalars
    tensor = st.recursive(cell, lambda kids: st.lists(kids, max_size=4), max_leaves=10)
    return encoded(st.one_of(json_values, st.fixed_dictionaries(
        {"inputs": st.dictionaries(st.sampled_from(["x", "y"]), tensor, max_size=2)})))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _npy_header(descr: str, shape: tuple[int, ...], data: bytes) -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def infer_npy() -> st.SearchStrategy[bytes]:
    """``.npy`` bodies: real arrays of many dtypes and shapes, forged headers, truncations."""
    dtypes = st.sampled_from(["<f4", "<f8", "<i8", "|u1", "<c8", "|b1", "<U3"])
    shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
    real = st.builds(lambda d, s: _npy(np.zeros(s, dtype=d)), dtypes, shapes)
    forged = st.builds(_npy_header, st.sampled_from(["<f4", "|O", "<V8", "bogus"]),
                       st.sampled_from([(2**40, 4), (1, 1), (-1,), (1, 2**62)]),
                       st.binary(max_size=16))
    return st.one_of(real, forged, real.map(lambda b: b[:len(b) // 2]))


# ---- harness --------------------------------------------------------------------------
@dataclass
class Target:
    """One endpoint: how to reach it, what to send, and the state a rejection must keep."""

    name: str
    method: str
    path: str
    bodies: st.SearchStrategy[bytes]
    client: Callable[[], Any] = field(repr=False)
    state: Callable[[], Any] = field(repr=False)
    default_type: str = "application/json"
    default_auth: str | None = None
    paths: st.SearchStrategy[str] = st.just("")
    after: Callable[[Req, int], None] = field(default=lambda req, status: None, repr=False)

    def requests(self, headers: bool = False) -> st.SearchStrategy[Req]:
        """Fuzzed bodies with right headers, or with fuzzed headers too."""
        return requests(self.bodies, self.default_type, self.default_auth, self.paths, headers)

    def adversarial(self) -> st.SearchStrategy[Req]:
        """Deeply nested and huge-number JSON bodies."""
        return adversarial(self.default_type, self.default_auth, self.paths)


class Harness:
    """The extender, the inference server and the session proxy, built once, in process."""

    def __init__(self) -> None:
        self.extender, *_ = make_app()
        self._runtime_gen = running_tiny_runtime()
        self.runtime = next(self._runtime_gen)
        self.server = server_app(self.runtime, max_body_bytes=1 << 16)
        sc = self.server.test_client()
        sc.post("/v1/sessions", json={"name": "ml.web", "model": "tiny", "slo_ms": 2000,
                                      "rate_rps": 100})
        sc.post("/v1/sessions", json={"name": "be", "model": "tiny"})
        self.link = SessionLink("http://node-local:8700",
                                session_request("ml.web", "tiny", 0, slo_ms=2000, rate_rps=100),
                                transport=httpx.WSGITransport(app=self.server))
        self.link.ensure()
        self.proxy = create_proxy_app(self.link, ProxyConfig(max_body_bytes=1 << 16))

    def close(self) -> None:
        """Stop the runtime and the proxy's client."""
        self.link.close()
        self._runtime_gen.close()

    def _extender_state(self) -> Any:
        return self.extender.test_client().get("/v1/state", headers=AGENT_AUTH).get_json()

    def _sessions(self) -> Any:
        return sorted((s["name"], s.get("slo_ms"), s.get("weight"))
                      for s in self.runtime.snapshot()["sessions"])

    def _drop_new_session(self, req: Req, status: int) -> None:
        # A session the fuzzer registered is deleted again, so the next example starts clean.
        if status == 201:
            name = json.loads(req.body)["name"]
            self.runtime.remove_session(name)

    def targets(self) -> list[Target]:
        """Every POST endpoint (and the session DELETE) with its request strategy."""
        ext, srv, prx = (lambda: self.extender.test_client(), lambda: self.server.test_client(),
                         lambda: self.proxy.test_client())
        bearer = f"Bearer {TOKEN}"
        names = st.sampled_from(["ml.web", "be", "none", "%2e%2e", "s/infer", "\u00e9"])
        paths = st.sampled_from(["none", "%2e%2e", "\u00e9"])
        return [
            Target("extender /filter", "POST", "/filter", extender_args(), ext,
                   self._extender_state),
            Target("extender /prioritize", "POST", "/prioritize", extender_args(), ext,
                   self._extender_state),
            Target("extender /bind", "POST", "/bind", binding_args(), ext, self._extender_state),
            Target("extender /preempt", "POST", "/preempt", preemption_args(), ext,
                   self._extender_state),
            Target("extender /v1/agents/report", "POST", "/v1/agents/report", agent_reports(),
                   ext, self._extender_state, default_auth=bearer),
            Target("server /v1/sessions", "POST", "/v1/sessions", session_bodies(), srv,
                   self._sessions, after=self._drop_new_session),
            Target("server DELETE /v1/sessions/NAME", "DELETE", "/v1/sessions/{}", st.just(b""),
                   srv, self._sessions, paths=paths),
            Target("server /v1/sessions/NAME/infer (json)", "POST", "/v1/sessions/{}/infer",
                   infer_json(), srv, self._sessions, paths=names),
            Target("server /v1/sessions/NAME/infer (npy)", "POST", "/v1/sessions/{}/infer",
                   infer_npy(), srv, self._sessions, default_type=NPY, paths=names),
            Target("proxy /infer", "POST", "/infer", st.one_of(infer_npy(), infer_json()), prx,
                   self._sessions, default_type=NPY),
            Target("proxy /v1/sessions/NAME/infer", "POST", "/v1/sessions/{}/infer",
                   infer_npy(), prx, self._sessions, default_type=NPY, paths=names),
        ]


def send(target: Target, req: Req) -> tuple[int, str]:
    """Make the request; (status, body text)."""
    headers = {"Content-Type": req.content_type}
    if req.authorization is not None:
        headers["Authorization"] = req.authorization
    overrides = {} if req.content_length is None else {"CONTENT_LENGTH": req.content_length}
    path = target.path.format(req.path) if "{}" in target.path else target.path
    r = target.client().open(path, method=target.method, data=req.body, headers=headers,
                             environ_overrides=overrides)
    return r.status_code, r.get_data().decode("utf-8", "replace")


def problems(status: int, text: str, before: Any, after: Any) -> list[str]:
    """What breaks the property: 5xx, a traceback, a 4xx with no reason, state changed by a
    rejection (a 4xx, or a 200 whose extender ``Error`` is set)."""
    found = []
    if status >= 500:
        found.append(f"HTTP {status}")
    if "Traceback" in text or "internal error" in text:
        found.append("traceback or internal error in the answer")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    reason = ""
    if isinstance(doc, dict):
        reason = str(doc.get("Error") or doc.get("message") or doc.get("error") or "")
    if 400 <= status < 500 and not reason:
        found.append(f"HTTP {status} without a reason")
    if (400 <= status < 500 or (status == 200 and reason)) and before != after:
        found.append("state changed by a rejected request")
    return found


def check(target: Target, req: Req) -> tuple[int, list[str]]:
    """Send ``req`` and judge it; (status, problems)."""
    before = target.state()
    status, text = send(target, req)
    after = target.state()
    target.after(req, status)
    return status, problems(status, text, before, after)
