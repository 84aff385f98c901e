"""Model references: store paths, file://, https with size cap (mock transport, no network)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from predictor.errors import ModelRejected, ModelUnavailable, RejectReason
from predictor.store import NO_STORE, OUTSIDE_STORE, ModelStore, StoreConfig


@pytest.fixture()
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "vision").mkdir(parents=True)
    (root / "vision" / "m.onnx").write_bytes(b"model")
    (tmp_path / "outside.onnx").write_bytes(b"secret")
    (root / "escape.onnx").symlink_to(tmp_path / "outside.onnx")
    return root


REJECTED = {
    "dotdot": ("../outside.onnx", RejectReason.PATH_OUTSIDE_STORE),
    "absolute": ("/etc/passwd", RejectReason.PATH_OUTSIDE_STORE),
    "symlink-out": ("escape.onnx", RejectReason.PATH_OUTSIDE_STORE),
    "file-url-outside": ("file:///etc/passwd", RejectReason.PATH_OUTSIDE_STORE),
    "file-url-remote-host": ("file://host/m.onnx", RejectReason.BAD_REFERENCE),
    "plain-http": ("http://example.com/m.onnx", RejectReason.BAD_REFERENCE),
    "other-scheme": ("s3://bucket/m.onnx", RejectReason.BAD_REFERENCE),
    "empty": ("", RejectReason.BAD_REFERENCE),
    "nul-byte": ("vision/m.onnx\x00", RejectReason.BAD_REFERENCE),
}


@pytest.mark.parametrize(("ref", "reason"), REJECTED.values(), ids=REJECTED.keys())
def test_references_escaping_the_store_are_refused(store_root: Path, ref: str, reason) -> None:
    with pytest.raises(ModelRejected) as info:
        ModelStore(StoreConfig(root=store_root)).resolve(ref)
    assert info.value.reason is reason


OUTSIDE = {
    "absolute-existing": "/etc/passwd",
    "dotdot-existing": "../../etc/passwd",
    "absolute-missing": "/no/such/dir/m.onnx",
    "dotdot-missing": "../../no/such/dir/m.onnx",
    "file-url-existing": "file:///etc/passwd",
    "file-url-missing": "file:///no/such/dir/m.onnx",
}


@pytest.mark.parametrize("ref", OUTSIDE.values(), ids=OUTSIDE.keys())
def test_a_path_outside_the_store_gets_one_answer_without_a_look(
        store_root: Path, ref: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the path exists on the host cannot be read from the refusal: the text is
    the same for all, and nothing outside the store is stat'ed to give it."""
    root = store_root.resolve()
    store = ModelStore(StoreConfig(root=store_root))
    looked: list[str] = []

    def spy(real):
        def call(path, *a, **kw):
            if not Path(os.fsdecode(path)).is_relative_to(root) and Path(
                    os.fsdecode(path)) not in root.parents:
                looked.append(os.fsdecode(path))
            return real(path, *a, **kw)
        return call

    monkeypatch.setattr(os, "stat", spy(os.stat))
    monkeypatch.setattr(os, "lstat", spy(os.lstat))
    with pytest.raises(ModelRejected) as info:
        store.resolve(ref)
    assert info.value.reason is RejectReason.PATH_OUTSIDE_STORE
    assert info.value.detail == OUTSIDE_STORE
    assert str(info.value) == f"{ref}: path_outside_store: {OUTSIDE_STORE}"
    assert looked == []


def test_a_symlink_out_of_the_store_gets_the_same_answer(store_root: Path) -> None:
    (store_root / "dangling.onnx").symlink_to(store_root.parent / "no-such.onnx")
    store = ModelStore(StoreConfig(root=store_root))
    for ref in ("escape.onnx", "dangling.onnx"):
        with pytest.raises(ModelRejected) as info:
            store.resolve(ref)
        assert info.value.detail == OUTSIDE_STORE, ref


def test_store_paths_and_file_urls_resolve(store_root: Path) -> None:
    store = ModelStore(StoreConfig(root=store_root))
    target = (store_root / "vision" / "m.onnx").resolve()
    assert store.resolve("vision/m.onnx") == target
    assert store.resolve(f"file://{target}") == target
    with pytest.raises(ModelUnavailable):
        store.resolve("vision/missing.onnx")


SERVER_CONFIG = {"allow_remote": False, "absolute_inside_root": True}
"""The inference server's switches: only the mounted store, absolute paths inside it."""


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        pytest.param("https://example.com/m.onnx", RejectReason.BAD_REFERENCE, id="remote"),
        pytest.param("/etc/passwd", RejectReason.PATH_OUTSIDE_STORE, id="absolute-outside"),
        pytest.param("../outside.onnx", RejectReason.PATH_OUTSIDE_STORE, id="dotdot"),
    ],
)
def test_server_switches_still_refuse_what_leaves_the_store(
    store_root: Path, ref: str, reason: RejectReason
) -> None:
    with pytest.raises(ModelRejected) as info:
        ModelStore(StoreConfig(root=store_root, **SERVER_CONFIG)).resolve(ref)
    assert info.value.reason is reason


def test_server_switches_accept_an_absolute_path_inside_the_store(store_root: Path) -> None:
    target = (store_root / "vision" / "m.onnx").resolve()
    assert ModelStore(StoreConfig(root=store_root, **SERVER_CONFIG)).resolve(str(target)) == target


def _transport(body: bytes, status: int = 200, length: bool = True) -> httpx.MockTransport:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url)
        headers = {"content-length": str(len(body))} if length else {}
        if not length:
            return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body))
        return httpx.Response(status, headers=headers, content=body)

    transport = httpx.MockTransport(handler)
    transport.calls = calls  # type: ignore[attr-defined]
    return transport


def test_https_download_is_cached_by_url(tmp_path: Path) -> None:
    transport = _transport(b"onnx-bytes")
    store = ModelStore(StoreConfig(cache_dir=tmp_path / "cache"), transport=transport)
    first = store.resolve("https://models.example/m.onnx")
    assert first.read_bytes() == b"onnx-bytes"
    assert store.resolve("https://models.example/m.onnx") == first
    assert len(transport.calls) == 1
    assert not list((tmp_path / "cache").glob("*.part"))


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "no-length"])
def test_https_size_cap(tmp_path: Path, declared: bool) -> None:
    store = ModelStore(
        StoreConfig(cache_dir=tmp_path, max_download_bytes=100),
        transport=_transport(b"x" * 1000, length=declared),
    )
    with pytest.raises(ModelRejected) as info:
        store.resolve("https://models.example/big.onnx")
    assert info.value.reason is RejectReason.TOO_LARGE and info.value.limit == 100
    assert list(tmp_path.iterdir()) == []


def test_https_errors_are_unavailable(tmp_path: Path) -> None:
    store = ModelStore(StoreConfig(cache_dir=tmp_path), transport=_transport(b"", status=404))
    with pytest.raises(ModelUnavailable, match="404"):
        store.resolve("https://models.example/none.onnx")

    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out", request=request)

    store = ModelStore(StoreConfig(cache_dir=tmp_path), transport=httpx.MockTransport(boom))
    with pytest.raises(ModelUnavailable, match="ConnectTimeout"):
        store.resolve("https://models.example/slow.onnx")


@pytest.mark.parametrize("ref", ["/etc/hostname", "/etc/nonexistent", "file:///etc/hostname",
                                 "file:///etc/nonexistent", "relative/model.onnx"])
def test_servers_without_a_store_refuse_every_local_path_with_one_text(ref, monkeypatch):
    """#25: with no ``predictor.model_store`` the extender answered /etc/hostname and
    /etc/nonexistent differently, telling a pod owner which paths exist on its host."""
    looked: list[str] = []
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda path, *a, **kw: looked.append(os.fsdecode(path))
                        or real(path, *a, **kw))
    store = ModelStore(StoreConfig(root=None, local_files=False))
    with pytest.raises(ModelRejected) as info:
        store.resolve(ref)
    assert (info.value.reason, info.value.detail) == (RejectReason.PATH_OUTSIDE_STORE, NO_STORE)
    assert looked == []


def test_the_extender_predictor_without_a_store_refuses_local_paths(tmp_path):
    from predictor.api import Predictor

    predictor = Predictor.from_dirs(None, None, background_fetch=True)
    answers = set()
    for ref in ("/etc/hostname", "/etc/nonexistent"):
        with pytest.raises(ModelRejected) as info:
            predictor.store.resolve(ref)
        answers.add(str(info.value).split(": ", 1)[1])
    assert answers == {f"path_outside_store: {NO_STORE}"}
    assert Predictor.from_dirs(None, None).store.config.local_files  # the CLI keeps them
