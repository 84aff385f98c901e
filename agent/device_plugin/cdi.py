"""The CDI device names this node's container runtime can resolve.

The NVIDIA Container Toolkit writes a CDI spec (``nvidia-ctk cdi generate``, or the
GPU Operator with CDI on) into ``/etc/cdi`` or ``/var/run/cdi``: one file per
vendor kind, listing devices by index, UUID and ``all``. The plugin answers with
``nvidia.com/gpu=<uuid>`` only when that exact name is in a spec here, because a
name the runtime cannot resolve fails the container's creation.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import yaml

DEFAULT_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
_MAX_SPEC_BYTES = 4 << 20

log = logging.getLogger(__name__)


def cdi_device_names(dirs: Iterable[Path] = DEFAULT_DIRS) -> set[str]:
    """Fully qualified names (``kind=name``) of every device in the CDI specs found."""
    names: set[str] = set()
    for directory in dirs:
        try:
            files = sorted(p for p in directory.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
        except OSError:
            continue
        for path in files:
            names |= _names_in(path)
    return names


def _names_in(path: Path) -> set[str]:
    try:
        if path.stat().st_size > _MAX_SPEC_BYTES:
            log.warning("CDI spec %s is larger than %d bytes; skipped", path, _MAX_SPEC_BYTES)
            return set()
        text = path.read_text()
        spec = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        log.warning("CDI spec %s unreadable (%s); skipped", path, type(exc).__name__)
        return set()
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str):
        return set()
    kind = spec["kind"]
    devices = spec.get("devices") if isinstance(spec.get("devices"), list) else []
    return {f"{kind}={d['name']}" for d in devices
            if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"]}
