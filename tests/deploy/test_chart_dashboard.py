"""The chart ships the Grafana dashboard on request: one file (manifests/grafana links to
it), in a ConfigMap Grafana's dashboard sidecar picks up by its label."""

from __future__ import annotations

import json

from chart_helpers import CHART, render
from manifests_helpers import MANIFESTS, find


def test_the_dashboard_is_opt_in_and_is_the_one_file() -> None:
    assert not [o for o in render() if o["metadata"]["name"] == "tandem-grafana-dashboard"]
    objects = render("grafana.dashboard.enabled=true", "grafana.dashboard.namespace=monitoring")
    cm = find(objects, "ConfigMap", "tandem-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    shipped = (CHART / "dashboards/tandem-dashboard.json").read_text()
    assert json.loads(cm["data"]["tandem-dashboard.json"]) == json.loads(shipped)
    linked = MANIFESTS / "grafana/tandem-dashboard.json"
    assert linked.is_symlink() and linked.resolve() == (CHART / "dashboards/tandem-dashboard.json")
