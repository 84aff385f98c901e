"""docs/plan-file.md documents every key lab/planning/planfile.py accepts (asked of the parser
itself, through its unknown-key message), and its worked example plans to the output shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lab.planning.planfile import parse_plan
from planner.types import PlanFileError
from tandem.cli import app

DOC = (Path(__file__).resolve().parents[2] / "docs/plan-file.md").read_text(encoding="utf-8")
PROBE = "zz_not_a_key"

# Where each place in a plan file may hold keys: a document that puts PROBE there, and the
# heading of the doc section that must document that place's keys.
PLACES = {
    "plan": ({"gpu_types": {}, PROBE: 1}, "## Top level"),
    "gpu type": ({"gpu_types": {"g": {"memory_mib": 1, PROBE: 1}}}, "### `gpu_types`"),
    "profile": ({"gpu_types": {}, "profiles": [{PROBE: 1}]}, "### `profiles`"),
    "nexus profile": (
        {"gpu_types": {}, "profiles": [{"nexus_profile": "p.txt", PROBE: 1}]}, "### `profiles`"),
    "linear": ({"gpu_types": {}, "profiles": [{"linear": {PROBE: 1}}]}, "### `profiles`"),
    "session": ({"gpu_types": {}, "sessions": [{PROBE: 1}]}, "### `sessions`"),
    "query": ({"gpu_types": {}, "queries": [{PROBE: 1}]}, "### `queries`"),
    "module": ({"gpu_types": {}, "queries": [{"modules": [{PROBE: 1}]}]}, "### `queries`"),
    "options": ({"gpu_types": {}, "options": {PROBE: True}}, "### `options`"),
}


def accepted_keys(doc: dict) -> set[str]:
    """The keys the parser allows where ``doc`` puts PROBE, read from its own error."""
    with pytest.raises(PlanFileError) as caught:
        parse_plan(doc)
    pattern = rf"\.{PROBE}: unknown key \(allowed: ([^)]*)\)$"
    (allowed,) = [m.group(1) for p in caught.value.problems if (m := re.search(pattern, p))]
    return set(allowed.split(", "))


def section(heading: str) -> str:
    """The doc's text from ``heading`` to the next heading."""
    start = DOC.index(f"\n{heading}\n")
    following = re.search(r"^#{2,3} ", DOC[start + len(heading) + 2:], re.M)
    end = start + len(heading) + 2 + following.start() if following else len(DOC)
    return DOC[start:end]


def documented(heading: str) -> set[str]:
    """The keys that head a table row in the doc section ``heading``."""
    return set(re.findall(r"^\| `([a-z_]+)` \|", section(heading), re.M))


@pytest.mark.parametrize("place", PLACES)
def test_every_accepted_key_is_documented_in_its_section(place: str) -> None:
    doc, heading = PLACES[place]
    keys = accepted_keys(doc)
    assert keys, place
    missing = keys - documented(heading)
    assert not missing, f"docs/plan-file.md {heading} does not document {sorted(missing)}"


def test_every_documented_key_is_accepted() -> None:
    by_heading: dict[str, set[str]] = {}
    for doc, heading in PLACES.values():
        by_heading.setdefault(heading, set()).update(accepted_keys(doc))
    for heading, keys in by_heading.items():
        extra = documented(heading) - keys
        assert not extra, f"{heading} documents keys the parser rejects: {sorted(extra)}"


def _blocks(kind: str, text: str) -> list[str]:
    """The fenced blocks of ``text`` whose info string is ``kind`` (fences paired in order)."""
    return [body for info, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)
            if info == kind]


def test_worked_example_parses_plans_and_prints_the_output_shown(tmp_path: Path) -> None:
    example = section("## Worked example")
    (plan_yaml,) = _blocks("yaml", example)
    spec = parse_plan(yaml.safe_load(plan_yaml))
    assert spec.sessions and spec.queries and spec.options.cost_per_gpu_type
    (shown,) = [b for b in _blocks("", example) if b.startswith("$ tandem plan")]
    path = tmp_path / "plan.yaml"
    path.write_text(plan_yaml, encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(shown.split("\n", 1)[1])
