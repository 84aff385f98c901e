"""The chart's values are checked: a misspelt key or a value of the wrong type fails the
render with helm's own message, and the schema stays what values.yaml describes."""

from __future__ import annotations

import pytest
from chart_helpers import helm_template
from chart_schema import SCHEMA, text


def test_the_schema_is_built_from_values_yaml() -> None:
    assert SCHEMA.read_text() == text(), "run: python tests/chart_schema.py"


@pytest.mark.parametrize(("setting", "problem"), [
    ("mps.enabeld=true", "'enabeld' not allowed"),
    ("agent.serveGPUs=false", "'serveGPUs' not allowed"),
    ("replicas=two", "replicas"),
    ("devicePlugin.enabled=yes", "devicePlugin"),
])
def test_a_misspelt_or_mistyped_value_fails_the_render(setting: str, problem: str) -> None:
    result = helm_template(setting, check=False)
    assert result.returncode != 0 and problem in result.stderr, result.stderr


@pytest.mark.parametrize("setting", [
    "config.limits.min_colocation_gain_percent=5",  # the extender checks its own config
    "agent.nodeSelector.pool=gpu", "agent.modelStore.emptyDir.sizeLimit=2Mi",
    "webhook.settings.translate_nvidia_gpu=true",
])
def test_open_values_stay_open(setting: str) -> None:
    assert helm_template(setting, check=False).returncode == 0
