"""Model references (the ``tandem.io/model`` annotation) resolved to local ONNX files.

Accepted forms:

- a relative path in the model store: ``vision/resnet50.onnx`` -> ``<root>/vision/...``;
  anything that resolves outside the root (``..``, absolute paths, symlinks out)
  is refused with ``PATH_OUTSIDE_STORE``. Without a root, plain paths are local files
  for the CLI (``local_files=True``); servers (``local_files=False``) refuse every one
  with ``NO_STORE``, before the filesystem is looked at.
- ``file:///abs/path.onnx``: with a root, the path must also be inside it.
- ``https://host/model.onnx``: streamed with a size cap and a timeout into the
  cache directory under the sha256 of the URL; a URL is treated as immutable
  (publish a new URL for a new model). Plain ``http://`` is refused unless allowed.

``allowed_sources`` restricts remote references to URL prefixes (the extender's
``predictor.allowed_model_sources``): a prefix is ``https://host[:port]/path/``,
and a reference matches when its scheme and host are the prefix's and its path,
free of ``..`` and ``.`` segments, lies under the prefix's path.

Two switches serve readers that see only a mounted store (the inference server):
``allow_remote=False`` refuses ``http(s)://`` references, and
``absolute_inside_root=True`` reads a plain absolute path as ``file://`` (allowed
only inside the root).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from predictor.errors import ModelNotFound, ModelRejected, ModelUnavailable, RejectReason

OUTSIDE_STORE = "resolves outside the model store"
"""The one refusal text for a reference outside the store, whatever lies there."""
NO_STORE = "local model files are not accepted: no model store is configured"
"""The one refusal text for every local reference when a server has no store."""


@dataclass(frozen=True)
class StoreConfig:
    """Where models live and how remote ones are fetched."""

    root: Path | None = None
    """Model store directory; None lets plain paths name any local file (CLI use)."""
    cache_dir: Path | None = None
    """Where downloads go; defaults to ``<root>/.cache`` or a temp directory."""
    max_download_bytes: int = 2_000_000_000
    timeout_seconds: float = 30.0
    """Per connect or read: a server silent for this long fails the download."""
    deadline_seconds: float | None = None
    """Whole download: a server trickling bytes fails once this much time has passed."""
    allow_http: bool = False
    allow_remote: bool = True
    """False refuses ``http(s)://`` references instead of downloading them."""
    allowed_sources: tuple[str, ...] | None = None
    """URL prefixes remote references must match; None: any (CLI use), (): none."""
    absolute_inside_root: bool = False
    """With a root, accept a plain absolute path that lies inside it (as ``file://`` is)."""
    local_files: bool = True
    """Without a root: True lets plain paths name any local file (CLI use); False refuses
    them all with one text (servers: a pod owner must not learn which paths exist)."""


def source_problem(prefix: Any) -> str | None:
    """Why ``prefix`` is not a valid allowed model source, or None if it is."""
    if not isinstance(prefix, str):
        return "must be a string"
    parsed = urlparse(prefix)
    if parsed.scheme == "http":
        return ("must be an https:// URL: plain http is refused "
                "(a model could be swapped in transit)")
    if parsed.scheme != "https" or not parsed.hostname:
        return "must be an https:// URL with a host"
    if parsed.username or parsed.password or parsed.query or parsed.fragment:
        return "must not carry credentials, a query or a fragment"
    if not prefix.endswith("/"):
        return "must end with '/' (so https://a.example does not allow https://a.example.evil)"
    if {".", ".."} & set(parsed.path.split("/")):
        return "must not contain '.' or '..' segments"
    return None


def source_allows(prefix: str, ref: str) -> bool:
    """True when the remote reference ``ref`` lies under the allowed source ``prefix``."""
    want, got = urlparse(prefix), urlparse(ref)
    if got.username or got.password or {".", ".."} & set(unquote(got.path).split("/")):
        return False  # credentials could name another host; dot segments climb out
    return (got.scheme == want.scheme and got.netloc.lower() == want.netloc.lower()
            and got.path.startswith(want.path))


class ModelStore:
    """Resolve references to files; ``transport`` is injectable (httpx) for tests."""

    def __init__(self, config: StoreConfig | None = None, transport: Any = None):
        self.config = config or StoreConfig()
        self.transport = transport

    @staticmethod
    def is_remote(ref: str) -> bool:
        """True for ``http(s)://`` references (fetched over the network)."""
        return urlparse(ref).scheme in ("https", "http") if ref else False

    def check_remote(self, ref: str) -> None:
        """ModelRejected unless this remote reference may be fetched."""
        if not self.config.allow_remote:
            raise ModelRejected(
                RejectReason.BAD_REFERENCE, "remote references are not allowed", model=ref
            )
        if urlparse(ref).scheme == "http" and not self.config.allow_http:
            raise ModelRejected(RejectReason.BAD_REFERENCE, "plain http is not allowed", model=ref)
        allowed = self.config.allowed_sources
        if allowed is not None and not any(source_allows(p, ref) for p in allowed):
            # Says nothing of the host it runs on: only that the URL is not allowed.
            raise ModelRejected(RejectReason.BAD_REFERENCE,
                                "remote model source is not allowed", model=ref)

    def cached(self, ref: str) -> Path | None:
        """The downloaded file of a remote reference, if it is already in the cache."""
        target = self._cache_dir() / (hashlib.sha256(ref.encode()).hexdigest() + ".onnx")
        return target if target.is_file() else None

    def resolve(self, ref: str) -> Path:
        """The local file a reference names (downloading https references once)."""
        if not ref or "\x00" in ref:
            raise ModelRejected(RejectReason.BAD_REFERENCE, "empty or NUL in model reference")
        parsed = urlparse(ref)
        if parsed.scheme in ("https", "http"):
            self.check_remote(ref)
            return self._download(ref)
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost"):
                raise ModelRejected(
                    RejectReason.BAD_REFERENCE, "file:// must name a local path", model=ref
                )
            return self._local(Path(unquote(parsed.path)), ref, absolute_ok=True)
        if parsed.scheme and len(parsed.scheme) > 1:  # one letter would be a Windows drive
            raise ModelRejected(
                RejectReason.BAD_REFERENCE, f"unsupported scheme {parsed.scheme!r}", model=ref
            )
        absolute_ok = self.config.root is None or self.config.absolute_inside_root
        return self._local(Path(ref), ref, absolute_ok=absolute_ok)

    def _local(self, path: Path, ref: str, absolute_ok: bool) -> Path:
        root = self.config.root
        if root is None and not self.config.local_files:
            # Before the filesystem is touched: the same answer for /etc/hostname and
            # /etc/nonexistent.
            raise ModelRejected(RejectReason.PATH_OUTSIDE_STORE, NO_STORE, model=ref)
        if root is None:
            target = path.expanduser().resolve()
        else:
            # One answer for every reference outside the store, given before the
            # filesystem is touched, so a refusal never tells whether the path exists.
            outside = ModelRejected(RejectReason.PATH_OUTSIDE_STORE, OUTSIDE_STORE, model=ref)
            if path.is_absolute() and not absolute_ok:
                raise outside
            base = Path(root).resolve()
            if not Path(os.path.normpath(base / path)).is_relative_to(base):
                raise outside  # "..", or an absolute path elsewhere: lexically outside
            target = (base / path).resolve()
            if not target.is_relative_to(base):
                raise outside  # a symlink in the store that points out of it
        if not target.is_file():
            raise ModelNotFound(f"{ref}: no such model file")
        return target

    def _cache_dir(self) -> Path:
        if self.config.cache_dir is not None:
            return Path(self.config.cache_dir)
        if self.config.root is not None:
            return Path(self.config.root) / ".cache"
        return Path(tempfile.gettempdir()) / "tandem-models"

    def _download(self, url: str) -> Path:
        import httpx

        cache = self._cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / (hashlib.sha256(url.encode()).hexdigest() + ".onnx")
        if target.is_file():
            return target
        limit = self.config.max_download_bytes
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".part")
        try:
            with (
                os.fdopen(fd, "wb") as out,
                httpx.Client(
                    transport=self.transport,
                    timeout=self.config.timeout_seconds,
                    follow_redirects=True,
                    max_redirects=3,
                ) as client,
                client.stream("GET", url) as response,
            ):
                if response.status_code != 200:
                    raise ModelUnavailable(f"{url}: HTTP {response.status_code}")
                declared = response.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limit:
                    raise ModelRejected(
                        RejectReason.TOO_LARGE, f"content-length {declared}", limit, url
                    )
                received = 0
                deadline = self.config.deadline_seconds
                end = time.monotonic() + deadline if deadline is not None else None
                for chunk in response.iter_bytes():
                    if end is not None and time.monotonic() > end:
                        raise ModelUnavailable(f"{url}: not received within {deadline:g} s")
                    received += len(chunk)
                    if received > limit:  # a lying or absent content-length
                        raise ModelRejected(
                            RejectReason.TOO_LARGE, f"more than {limit} bytes received", limit, url
                        )
                    out.write(chunk)
            os.replace(tmp, target)
        except httpx.HTTPError as exc:
            raise ModelUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target
