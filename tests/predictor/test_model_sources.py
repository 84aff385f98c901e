"""Remote model references are fetched only from the configured allowed sources."""

from __future__ import annotations

import time

import httpx
import pytest
from extender_builders import PodBuilder, args, make_app, node

from extender.config.schema import ConfigError, build_config
from extender.config.sections import PredictorConfig
from extender.wiring import build_predictor
from predictor.api import Predictor
from predictor.errors import ModelRejected
from predictor.fetch import BackgroundFetcher, ModelBeingFetched
from predictor.store import ModelStore, StoreConfig, source_allows

ALLOWED = "https://models.example/released/"


@pytest.mark.parametrize("ref,allowed", [
    ("https://models.example/released/resnet50.onnx", True),
    ("https://MODELS.example/released/v2/m.onnx", True),
    ("https://models.example/other/m.onnx", False),
    ("https://models.example/released/../private/m.onnx", False),
    ("https://models.example/released/%2e%2e/private/m.onnx", False),
    ("https://models.example.evil/released/m.onnx", False),
    ("https://models.example@evil.example/released/m.onnx", False),
    ("http://models.example/released/m.onnx", False),
    ("https://models.example:8443/released/m.onnx", False),
])
def test_a_reference_matches_only_under_its_prefix(ref, allowed):
    assert source_allows(ALLOWED, ref) is allowed


def test_config_accepts_prefixes_and_defaults_to_none():
    assert build_config({}).predictor.allowed_model_sources == ()
    cfg = build_config({"predictor": {"allowed_model_sources": [ALLOWED]}})
    assert cfg.predictor.allowed_model_sources == (ALLOWED,)


@pytest.mark.parametrize("entry,problem", [
    ("https://models.example", "end with '/'"),
    ("ftp://models.example/", "https://"),
    ("http://models.example/", "plain http is refused"),
    ("https://user:pw@models.example/", "credentials"),
    ("https://models.example/a/../", "'..'"),
    (5, "must be a string"),
])
def test_config_refuses_bad_prefixes_with_the_path(entry, problem):
    with pytest.raises(ConfigError) as err:
        build_config({"predictor": {"allowed_model_sources": ["https://ok.example/", entry]}})
    assert any(p.startswith("predictor.allowed_model_sources[1]:") and problem in p
               for p in err.value.problems), err.value.problems


def test_the_extender_predictor_gets_the_configured_sources():
    predictor = build_predictor(PredictorConfig(allowed_model_sources=(ALLOWED,)))
    assert predictor.fetcher.store.config.allowed_sources == (ALLOWED,)
    assert build_predictor(PredictorConfig()).fetcher.store.config.allowed_sources == ()


def test_the_extender_downloads_beside_a_read_only_store(tmp_path):
    """The installs mount the model store read-only: downloads must not go into it."""
    predictor = build_predictor(PredictorConfig(model_store=str(tmp_path),
                                                allowed_model_sources=(ALLOWED,)))
    cache = predictor.fetcher.store._cache_dir()
    assert not cache.is_relative_to(tmp_path) and cache.name == "tandem-models"


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_filter_refuses_a_source_outside_the_list_and_fetches_one_inside(tmp_path):
    served = []

    def handler(request):
        served.append(str(request.url))
        return httpx.Response(200, content=b"onnx bytes")

    fetch_store = ModelStore(StoreConfig(root=tmp_path, allowed_sources=(ALLOWED,)),
                             transport=httpx.MockTransport(handler))
    predictor = Predictor(object(), fetch_store, fetcher=BackgroundFetcher(fetch_store))
    app, *_ = make_app([node("n1", 2)], predictor=predictor)
    client = app.test_client()

    outside = PodBuilder("out").uid("u-out").model("https://elsewhere.example/m.onnx").obj()
    body = client.post("/filter", json=args(outside, ["n1"])).get_json()
    reason = body["FailedAndUnresolvableNodes"]["n1"]
    assert body["NodeNames"] == [] and "remote model source is not allowed" in reason
    assert str(tmp_path) not in reason  # nothing about the extender host's filesystem
    assert predictor.fetcher.in_flight() == 0 and served == []

    inside = PodBuilder("in").uid("u-in").model(f"{ALLOWED}m.onnx").obj()
    body = client.post("/filter", json=args(inside, ["n1"])).get_json()
    assert "model being fetched" in body["FailedAndUnresolvableNodes"]["n1"]
    wait_for(lambda: predictor.fetcher.in_flight() == 0)
    assert served == [f"{ALLOWED}m.onnx"]
    assert fetch_store.cached(f"{ALLOWED}m.onnx").read_bytes() == b"onnx bytes"


def test_an_empty_list_refuses_every_remote_reference(tmp_path):
    fetcher = BackgroundFetcher(ModelStore(StoreConfig(root=tmp_path, allowed_sources=())))
    with pytest.raises(ModelRejected, match="not allowed") as err:
        fetcher.resolve(f"{ALLOWED}m.onnx")
    assert not isinstance(err.value, ModelBeingFetched) and fetcher.in_flight() == 0


def test_filter_reasons_do_not_tell_whether_a_path_outside_the_store_exists(tmp_path):
    """A pod owner probing the extender host reads the same reason for every path outside
    the model store (the shipped installs set predictor.model_store)."""
    (tmp_path / "store").mkdir()
    (tmp_path / "exists.onnx").write_bytes(b"not for pods")
    predictor = build_predictor(PredictorConfig(model_store=str(tmp_path / "store")))
    app, *_ = make_app([node("n1", 2)], predictor=predictor)
    client = app.test_client()
    refs = ["/etc/passwd", "../../etc/passwd", "../exists.onnx", "/no/such/dir/m.onnx",
            "../../no/such/dir/m.onnx", "../missing.onnx"]
    reasons = set()
    for i, ref in enumerate(refs):
        p = PodBuilder(f"p{i}").uid(f"u{i}").model(ref).obj()
        body = client.post("/filter", json=args(p, ["n1"])).get_json()
        assert body["NodeNames"] == [], ref
        reason = body["FailedAndUnresolvableNodes"]["n1"]
        assert "outside the model store" in reason and str(tmp_path) not in reason, reason
        reasons.add(reason.replace(ref, "REF"))
    assert len(reasons) == 1, reasons
