"""Every command's help fits 80 columns, never cuts text short, and shows flags without
a value placeholder (``--json``, not ``--json <bool>``)."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tandem.cli import app

ROOT = typer.main.get_command(app)


def commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    if hasattr(group, "commands"):  # a group (typer vendors its own click)
        for name, sub in sorted(group.commands.items()):
            out += commands(sub, (*path, name))
    return out


PATHS = commands(ROOT)


def test_the_walk_finds_the_commands() -> None:
    assert ("extender", "serve") in PATHS and ("agent", "run") in PATHS and len(PATHS) > 20


@pytest.mark.parametrize("path", PATHS, ids=[" ".join(p) or "tandem" for p in PATHS])
def test_help_fits_80_columns_without_placeholders_on_flags(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"},
                                terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    assert "<bool>" not in result.output
    assert "…" not in result.output  # nothing cut short


def test_profile_takes_subcommands_like_the_other_groups() -> None:
    # `tandem profile run|plan` were one command with a positional action; now a group whose
    # two subcommands share one option list.
    assert ("profile", "run") in PATHS and ("profile", "plan") in PATHS
    run, plan = (CliRunner().invoke(app, ["profile", name, "--help"]).output
                 for name in ("run", "plan"))
    options = [[ln.split()[0] for ln in text.splitlines() if ln.strip().startswith("--")]
               for text in (run, plan)]
    assert options[0] == options[1] and "--json" in options[0] and "--backend" in options[0]
