"""The operator docs stay in step with the code: every rejection reason is explained,
every metric the dashboard plots exists, and the docs' links resolve."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from extender.core.reasons import Reason, is_unresolvable

DOCS = Path(__file__).resolve().parents[2] / "docs"
REPO = DOCS.parent
TROUBLE = (DOCS / "troubleshooting.md").read_text()
DASHBOARD = REPO / "manifests/grafana/tandem-dashboard.json"


@pytest.mark.parametrize("reason", list(Reason), ids=[r.name for r in Reason])
def test_every_reason_is_explained_with_its_event_reason_and_kind(reason: Reason) -> None:
    row = next((line for line in TROUBLE.splitlines()
                if line.startswith(f"| `{reason.value}` |")), None)
    assert row is not None, f"troubleshooting.md has no row for {reason.value!r}"
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == f"`{reason.event_reason}`"
    assert cells[2] == ("unresolvable" if is_unresolvable(reason) else "resolvable")


def _exported_metric_names() -> set[str]:
    names: set[str] = set()
    for path in ("extender/ops/metrics.py", "extender/queue/metrics.py", "agent/node/exporter.py"):
        text = (REPO / path).read_text()
        names |= set(re.findall(r'"((?:tandem|DCGM)_[A-Za-z_]+)"', text))
    # prometheus_client adds _total to counters and _bucket/_sum/_count to histograms.
    return names


def test_dashboard_is_valid_grafana_json_plotting_only_real_metrics() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["panels"] and board["uid"]
    exported = _exported_metric_names()
    used = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\b((?:tandem|DCGM)_[A-Za-z_]+)", target["expr"]))
    assert used, "the dashboard queries no metric"
    suffixes = ("_total", "_bucket", "_sum", "_count")
    unknown = {u for u in used
               if u not in exported and not any(u.endswith(s) and u[: -len(s)] in exported
                                                for s in suffixes)}
    assert not unknown, f"dashboard queries metrics nobody exports: {unknown}"
    assert any(u.startswith("DCGM_") for u in used) and any(u.startswith("tandem_") for u in used)


def test_metrics_page_lists_every_exported_metric() -> None:
    page = (DOCS / "metrics.md").read_text()
    missing = [n for n in _exported_metric_names() if f"`{n}" not in page]
    assert not missing, missing


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_resolve(page: str) -> None:
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (DOCS / target).resolve().exists(), f"{page}: broken link {target}"
