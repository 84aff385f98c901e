"""The fake Kubernetes API server's HTTP side (``fake_kube_api``): keep-alive HTTP/1.1,
routing of the core/v1 paths it serves to the store's methods, chunked watch streams,
and the per-request faults ``FakeKubeApi.inject`` scripted."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from lab.fakes.kube_policy import ApiError, status

POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)(/binding|/eviction|/status)?$")
PDB_PATH = re.compile(r"^/apis/policy/v1(?:/namespaces/([^/]+))?/poddisruptionbudgets$")
EVENTS_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")
CONFIGMAP_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$")
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


class QuietServer(ThreadingHTTPServer):
    """Clients that hang up (a stopped extender's pooled connections) are not errors;
    ``accepted`` counts the connections clients opened."""

    accepted = 0
    request_queue_size = 128  # the listen backlog (socketserver's 5 drops bursts of connects)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Count the connection, then serve it on a thread of its own."""
        self.accepted += 1
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore disconnects; report anything else as the base class does."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def handler(api: Any) -> type[BaseHTTPRequestHandler]:
    """The request handler class serving ``api`` (a ``FakeKubeApi``)."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real server
        # TCP_NODELAY, as Go's net/http: headers and body go out as two writes, and with
        # Nagle the second waits for the client's delayed ACK (40 ms on Linux).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
            pass  # quiet: benchmarks and tests read the recorded requests instead

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                self._send(400, status(400, "BadRequest", "body is not JSON"))
                return
            api.record_request(self.command, url.path, query, body)
            if api.write_latency_s > 0 and self.command != "GET":
                # the storage write's wait (etcd's commit), on this request's thread only:
                # concurrent writes wait together, as etcd batches them into one commit
                time.sleep(api.write_latency_s)
            fault = api._take_fault(self.command, self.path)  # the query too: watch=true
            if fault is not None and isinstance(fault.kind, int):
                code = fault.kind  # refused before anything is applied
                self._send(code, status(code, "InjectedFault", f"injected fault {code}"))
                return
            try:
                if fault is not None:  # applied, but the answer never reaches the client
                    self._send = lambda code, body: None  # type: ignore[method-assign]
                self._route(url.path, query, body)
            except ApiError as exc:
                self._send(exc.code, status(exc.code, exc.reason, exc.message))
            if fault is not None:
                if fault.kind == "stall":
                    time.sleep(fault.stall_seconds)
                self.close_connection = True

        def _route(self, path: str, query: Mapping[str, str], body: Any) -> None:
            method = self.command
            if method == "GET" and path in ("/api/v1/nodes", "/api/v1/pods"):
                kind = path.rsplit("/", 1)[1]
                selector = query.get("fieldSelector", "")
                if query.get("watch") in ("true", "1"):
                    self._watch(kind, selector, query)
                else:
                    self._send(200, api.list_objects(kind, selector))
                return
            pod_match, event_match = POD_PATH.match(path), EVENTS_PATH.match(path)
            if pod_match and method == "GET" and not pod_match[3]:
                with api._cond:
                    self._send(200, api._stored_pod(pod_match[1], pod_match[2]))
            elif pod_match and method == "PATCH" and not pod_match[3]:
                self._send(200, api.patch_pod(pod_match[1], pod_match[2], body))
            elif pod_match and method == "PATCH" and pod_match[3] == "/status":
                self._send(200, api.patch_pod_status(pod_match[1], pod_match[2], body))
            elif pod_match and method == "POST" and pod_match[3] == "/binding":
                self._send(201, api.bind_pod(pod_match[1], pod_match[2], body))
            elif pod_match and method == "POST" and pod_match[3] == "/eviction":
                self._send(201, api.evict_pod(pod_match[1], pod_match[2], body))
            elif (pdb := PDB_PATH.match(path)) is not None and method == "GET":
                self._send(200, api.list_pdbs(pdb[1]))
            elif event_match and method == "POST":
                self._send(201, api.post_event(event_match[1], body))
            elif (cm := CONFIGMAP_PATH.match(path)) is not None:
                self._send(*api.configmap(method, cm[1], cm[2], body,
                                          query.get("labelSelector", "")))
            elif path == TOKEN_REVIEW_PATH and method == "POST":
                self._send(201, api.token_review(body))
            else:
                raise ApiError(404, "NotFound", f"{method} {path} is not served here")

        def _watch(self, kind: str, selector: str, query: Mapping[str, str]) -> None:
            since = int(query.get("resourceVersion") or api._rv)
            timeout = float(query.get("timeoutSeconds") or 1800)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in api.watch_lines(kind, selector, since, timeout):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        do_GET = do_PATCH = do_POST = do_PUT = _handle  # noqa: N815 - http.server's names

    return Handler
