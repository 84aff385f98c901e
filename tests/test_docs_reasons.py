"""Event reasons the extender's verbs count outside the core's Reason enum (a bad pod
request, a pending GPU hand-off) are explained in the troubleshooting table too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TROUBLE = (REPO / "docs/troubleshooting.md").read_text()
SERVICE = (REPO / "extender/service.py").read_text()
# FilterOutcome(0, {"BadPodRequest": ...}) and reasons["HandoffPending"] = ...
EMITTED = sorted(set(re.findall(r'\{"([A-Z][A-Za-z]+)": len\(', SERVICE))
                 | set(re.findall(r'reasons\["([A-Z][A-Za-z]+)"\]', SERVICE)))


def test_the_service_emits_the_reasons_this_test_knows() -> None:
    assert {"BadPodRequest", "HandoffPending"} <= set(EMITTED)


@pytest.mark.parametrize("reason", EMITTED)
def test_each_emitted_reason_has_a_row(reason: str) -> None:
    rows = [ln for ln in TROUBLE.splitlines() if ln.startswith("| `")]
    row = next((r for r in rows if f"| `{reason}` |" in r), None)
    assert row is not None, f"troubleshooting.md has no row for {reason}"
    kind = [c.strip() for c in row.strip("|").split("|")][2]
    assert kind.startswith(("resolvable", "unresolvable"))
