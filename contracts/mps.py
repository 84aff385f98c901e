"""Where a node's MPS control daemons keep their pipes and logs (one layout for the
agent, which runs the daemons, and the device plugin, which points containers at them).

One daemon per GPU: ``<root>/<gpu uuid>/pipe`` and ``<root>/<gpu uuid>/log``, and a
``<root>/shm`` shared-memory directory the daemons and their clients both see as
``/dev/shm``. ``root`` is a host path (``/run/tandem/mps`` in the installs).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_ROOT = Path("/run/tandem/mps")
CONTROL_PIPE = "control"
"""The control daemon's named pipe in the pipe directory; present while it runs."""


def pipe_dir(root: Path, uuid: str) -> Path:
    """The pipe directory of ``uuid``'s daemon (``CUDA_MPS_PIPE_DIRECTORY``)."""
    return root / _safe(uuid) / "pipe"


def log_dir(root: Path, uuid: str) -> Path:
    """The log directory of ``uuid``'s daemon (``CUDA_MPS_LOG_DIRECTORY``)."""
    return root / _safe(uuid) / "log"


def shm_dir(root: Path) -> Path:
    """The shared-memory directory the daemons and their clients mount as /dev/shm."""
    return root / "shm"


def _safe(uuid: str) -> str:
    if not uuid or "/" in uuid or uuid in (".", ".."):
        raise ValueError(f"not a GPU UUID: {uuid!r}")
    return uuid
