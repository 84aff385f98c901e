"""The verbs' WSGI fast path and pre-encoded answers behave exactly like the generic path."""

from __future__ import annotations

import io
import json
import sys
from typing import Any

import pytest
from extender_builders import args, make_app, training
from hypothesis import given
from hypothesis import strategies as st

from extender.wire import dumps, encode_host_priorities, host_priorities


@given(st.lists(st.tuples(st.text(max_size=12), st.integers(-5, 15)), max_size=20))
def test_encoded_priorities_equal_the_generic_encoding(pairs: list[tuple[str, int]]) -> None:
    names, scores = [n for n, _ in pairs], [s for _, s in pairs]
    encoded = encode_host_priorities(names, scores)
    assert bytes(encoded) == dumps(host_priorities(names, scores))
    assert dumps(encoded) == bytes(encoded)  # pre-encoded bodies pass through unchanged


def test_encoded_priorities_need_one_score_per_host() -> None:
    with pytest.raises(ValueError, match="one score per host"):
        encode_host_priorities(["a"], [])


def wsgi_post(app: Any, path: str, body: bytes, headers: dict[str, str]) -> tuple[str, bytes]:
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "t",
               "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, **headers}
    seen: dict[str, str] = {}

    def start_response(status: str, _headers: list[tuple[str, str]], *_: Any) -> None:
        seen["status"] = status
    out = b"".join(app(environ, start_response))
    return seen["status"], out


BODY = json.dumps(args(training("p"), ["n1"])).encode()


@pytest.mark.parametrize(("headers", "status", "passed"), [
    ({"CONTENT_LENGTH": str(len(BODY))}, "200 OK", ["n1"]),
    ({"wsgi.input_terminated": True}, "200 OK", ["n1"]),  # chunked: the server ends the stream
    ({}, "400 Bad Request", None),  # no length, not terminated: nothing is read
    ({"CONTENT_LENGTH": "ten"}, "400 Bad Request", None),
    ({"CONTENT_LENGTH": str(10 << 20)}, "413 Request Entity Too Large", None),
], ids=["content-length", "chunked", "no-length", "bad-length", "too-large"])
def test_fast_path_reads_bodies_like_werkzeug(headers: dict[str, Any], status: str,
                                              passed: list[str] | None) -> None:
    app, *_ = make_app()
    got_status, out = wsgi_post(app, "/filter", BODY, headers)
    assert got_status == status
    doc = json.loads(out)
    if passed is None:
        assert doc["Error"]
    else:
        assert doc["NodeNames"] == passed and doc["Error"] == ""


def test_other_methods_and_paths_still_go_through_flask() -> None:
    app, *_ = make_app()
    client = app.test_client()
    assert client.get("/filter").status_code == 405
    assert client.post("/nope", data=b"{}").status_code == 404
    ext_metrics = app.extensions["tandem_metrics"]
    labels = {"verb": "filter", "code": "200"}
    before = ext_metrics.registry.get_sample_value("tandem_extender_requests_total", labels) or 0
    client.post("/filter", json=args(training("q"), ["n1"]))
    client.post("/filter", json=args(training("r"), ["n1"]))
    after = ext_metrics.registry.get_sample_value("tandem_extender_requests_total", labels)
    assert after == before + 2  # cached metric children still count every request
