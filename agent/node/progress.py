"""Training progress of the pods on this node's GPUs, scraped from their own counters.

A training pod with ``tandem.io/progress`` (:func:`contracts.annotations.parse_progress`)
exposes a monotonically increasing step counter (and optionally a sample counter) in the
Prometheus text format on its own IP. Each interval the agent scrapes it beside the GPU
metrics and reports, per GPU, each such pod's steps per second over the time since the
previous scrape (``contracts.agentreport.ReportedProgress``): the extender learns who
slows whom from it (docs/interference.md).

Nothing is guessed. A pod is left out of the report, with the reason counted
(``tandem_agent_progress_skipped{reason}``), when its annotation does not parse
(``bad-annotation``), no process of it is on a GPU here to find its address by
(``no-address``), the endpoint does not answer or answers over :data:`MAX_BYTES`
(``unreachable``), the counter is absent or not a finite number (``no-counter``), it went
down (``counter-reset``: a restarted job; the next scrape starts again), or this is its
first scrape (``first-scrape``).

The address: the pod's network namespace seen through one of its GPU processes
(``/proc/<pid>/net/fib_trie``, whose host-local IPv4 entries are the pod's addresses), so
the agent needs no Kubernetes credentials, and an annotation names a port and path on the
pod itself, never another host.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from contracts.agentreport import ReportedProgress
from contracts.annotations import PROGRESS, AnnotationError, ProgressEndpoint, parse_progress

log = logging.getLogger(__name__)

MAX_BYTES = 1 << 20
"""The largest metrics page read (a training job's counters are a few lines)."""
TIMEOUT_SECONDS = 1.0
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class ProgressTarget:
    """One pod to scrape: its uid, the GPUs it is on and where its counters are."""

    uid: str
    gpu_indices: tuple[int, ...]
    endpoint: ProgressEndpoint
    host: str


def counter_value(text: str, name: str) -> float | None:
    """The value of counter ``name`` in a Prometheus text page: the sum over its series
    (a ``_total`` suffix accepted either way); None when absent or not finite."""
    names = {name, name + "_total"} if not name.endswith("_total") else {name}
    found, total = False, 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) not in names:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            return None
        if not math.isfinite(value) or value < 0:
            return None
        found, total = True, total + value
    return total if found else None


def pod_address(proc_root: Path, pid: int) -> str | None:
    """The pod's IPv4 address, from the network namespace of its process ``pid``: the
    first host-local address in ``/proc/<pid>/net/fib_trie`` that is not loopback."""
    try:
        lines = (proc_root / str(pid) / "net" / "fib_trie").read_text().splitlines()
    except OSError:
        return None
    for previous, line in zip(lines, lines[1:], strict=False):
        if "/32 host LOCAL" not in line:
            continue
        text = previous.strip().removeprefix("|--").strip()
        try:
            address = ipaddress.IPv4Address(text)
        except ValueError:
            continue
        if not address.is_loopback:
            return str(address)
    return None


class ProgressScraper:
    """Scrapes each target's counters and turns two scrapes into rates (module docstring)."""

    def __init__(self, get: Callable[[str], str | None] | None = None,
                 clock: Callable[[], float] | None = None,
                 on_skip: Callable[[str], None] | None = None):
        self._get = get or _http_get
        self.on_skip = on_skip
        self._clock = clock or time.monotonic
        self._last: dict[str, tuple[float, float, float | None]] = {}
        """uid -> (when, steps, samples) of its previous scrape."""
        self.skipped: dict[str, int] = {}

    def skip(self, reason: str, uid: str) -> None:
        """Count a pod left out, by reason (module docstring)."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if self.on_skip is not None:
            self.on_skip(reason)
        log.debug("progress skipped", extra={"pod_uid": uid, "reason": reason})

    def scrape(self, targets: Iterable[ProgressTarget]) -> dict[int, tuple[ReportedProgress, ...]]:
        """Per GPU index, the progress of the pods on it scraped now."""
        out: dict[int, list[ReportedProgress]] = {}
        seen = set()
        for t in targets:
            seen.add(t.uid)
            entry = self._one(t)
            if entry is not None:
                for index in t.gpu_indices:
                    out.setdefault(index, []).append(entry)
        for uid in [u for u in self._last if u not in seen]:  # pods gone
            del self._last[uid]
        return {index: tuple(v) for index, v in out.items()}

    def _one(self, t: ProgressTarget) -> ReportedProgress | None:
        page = self._get(f"http://{t.host}:{t.endpoint.port}{t.endpoint.path}")
        now = self._clock()
        if page is None:
            self.skip("unreachable", t.uid)
            return None
        steps = counter_value(page, t.endpoint.steps)
        samples = counter_value(page, t.endpoint.samples) if t.endpoint.samples else None
        if steps is None:
            self.skip("no-counter", t.uid)
            return None
        previous = self._last.get(t.uid)
        self._last[t.uid] = (now, steps, samples)
        if previous is None:
            self.skip("first-scrape", t.uid)
            return None
        then, steps_then, samples_then = previous
        window = now - then
        if steps < steps_then or (samples is not None and samples_then is not None
                                  and samples < samples_then):
            self.skip("counter-reset", t.uid)
            return None
        if window <= 0:
            return None
        rate = None if samples is None or samples_then is None \
            else (samples - samples_then) / window
        return ReportedProgress(t.uid, (steps - steps_then) / window, round(window, 3), rate)


def targets(pods: Iterable[tuple[str, int, Mapping[str, str]]],
            pids: Mapping[str, Iterable[int]], proc_root: Path,
            skip: Callable[[str, str], None]) -> list[ProgressTarget]:
    """The pods to scrape: ``pods`` as (uid, GPU index, annotations) with a progress
    annotation, addressed through one of their GPU processes ``pids[uid]``."""
    gpus: dict[str, list[int]] = {}
    notes: dict[str, Mapping[str, str]] = {}
    for uid, index, ann in pods:
        if PROGRESS in ann:
            gpus.setdefault(uid, []).append(index)
            notes[uid] = ann
    out = []
    for uid, indices in gpus.items():
        try:
            endpoint = parse_progress(notes[uid][PROGRESS])
        except AnnotationError:
            skip("bad-annotation", uid)
            continue
        host = next((a for pid in pids.get(uid, ()) if (a := pod_address(proc_root, pid))),
                    None)
        if host is None:
            skip("no-address", uid)
            continue
        out.append(ProgressTarget(uid, tuple(sorted(set(indices))), endpoint, host))
    return out


def _http_get(url: str) -> str | None:
    """The page at ``url`` (at most :data:`MAX_BYTES`), or None."""
    try:
        with httpx.stream("GET", url, timeout=TIMEOUT_SECONDS) as response:
            if response.status_code != 200:
                return None
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:
                    return None
            return body.decode("utf-8", errors="replace")
    except httpx.HTTPError:
        return None
