"""tandem's version: one number for the package, ``tandem --version``, the images and the chart.

The distribution is published as ``tandem-scheduler`` (the name ``tandem`` on the
public package index belongs to an unrelated project); the command stays ``tandem``.
The release process bumps ``[project] version`` in pyproject.toml, the image tags
in manifests/ and the chart's ``appVersion`` together, and a test checks they agree.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "tandem-scheduler"


def version() -> str:
    """The installed version, or the source tree's with ``+source`` when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    # Run from a checkout without installing (PYTHONPATH=.): read the number it would get.
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text())["project"]["version"]) + "+source"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
