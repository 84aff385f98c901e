"""Builds the chart's ``values.schema.json`` from ``values.yaml`` (no tests here).

Every mapping of the values is closed (``additionalProperties: false``), so a
misspelt key such as ``mps.enabeld`` fails ``helm install``/``template``; each
value's type is the default's. The keys in :data:`FREE_FORM` hold what Kubernetes
or the extender's own config checks (affinity, resources, the extender's
``tandem.yaml``), so they are left open. ``python tests/chart_schema.py`` rewrites
the file; ``tests/deploy/test_chart_schema.py`` checks it is up to date.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "tandem"
SCHEMA = CHART / "values.schema.json"
FREE_FORM_KEYS = {"nodeSelector", "affinity", "tolerations", "resources", "labels",
                  "namespaceSelector", "objectSelector", "modelStore", "issuerRef"}
FREE_FORM = {"config", "webhook.settings", "imagePullSecrets", "networkPolicy.schedulerFrom",
             "networkPolicy.metricsFrom"}
"""Dotted paths left open besides the keys above; ``config`` is checked by the extender."""
EXTRA = {"agent": {"modelStore": {"type": "object",
                                  "description": "former name of modelStore (still wins)"}}}


def _schema(value: Any, path: str) -> dict[str, Any]:
    key = path.rsplit(".", 1)[-1]
    if path in FREE_FORM or key in FREE_FORM_KEYS:
        return {"type": "array"} if isinstance(value, list) else \
            {"type": ["object", "null"]} if isinstance(value, dict) else {}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        items = {"type": "string"} if all(isinstance(i, str) for i in value) else {}
        return {"type": "array", "items": items}
    if isinstance(value, dict):
        props = {k: _schema(v, f"{path}.{k}" if path else k) for k, v in value.items()}
        props.update(EXTRA.get(path, {}))
        return {"type": "object", "properties": props, "additionalProperties": False}
    return {}


def build() -> dict[str, Any]:
    """The schema of the chart's values.yaml."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return {"$schema": "https://json-schema.org/draft-07/schema#", "title": "tandem chart values",
            **_schema(values, "")}


def text() -> str:
    """The schema file's text."""
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA.write_text(text())
    sys.stdout.write(f"wrote {SCHEMA}\n")
