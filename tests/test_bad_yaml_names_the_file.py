"""A file that is not valid YAML is reported with its own path, never as the parser's
``<unicode string>``: the extender's config, cluster files, curves files, profile and
plan files, and the webhook's settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

BAD = "a: [1, 2\nb: 3\n"


def _config(path: Path) -> None:
    from extender.config.loader import load_config
    load_config(path, environ={})


def _cluster(path: Path) -> None:
    from contracts.clusterfile import load_cluster_file
    load_cluster_file(path)


def _curves(path: Path) -> None:
    from predictor.curves import load_curves
    load_curves(path)


def _profiles(path: Path) -> None:
    from contracts.profilefile import read_profile_file
    read_profile_file(path)


@pytest.mark.parametrize("load", [_config, _cluster, _curves, _profiles],
                         ids=["config", "cluster", "curves", "profiles"])
def test_bad_yaml_names_the_file(tmp_path: Path, load: Callable[[Path], None]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(BAD)
    with pytest.raises(Exception) as err:  # each file kind's own error type
        load(path)
    assert "<unicode string>" not in str(err.value)
    assert f'"{path}", line' in str(err.value) or f"{path}" in str(err.value)
    assert "line 2" in str(err.value) or "line 3" in str(err.value)


def test_the_webhook_names_its_settings_file(tmp_path: Path) -> None:
    import typer

    from extender.webhook.commands import webhook

    path = tmp_path / "webhook.yaml"
    path.write_text(BAD)
    app = typer.Typer()
    app.command()(webhook)
    out = CliRunner().invoke(app, ["--config", str(path)])
    assert out.exit_code == 2
    assert "<unicode string>" not in out.output and f'"{path}", line' in out.output
