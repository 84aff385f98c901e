"""Optional extras: say which one a feature needs, and the line that installs it, before
any work starts (not as an ImportError after a long run)."""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "tandem-scheduler"
EXTRAS = {"plots": "matplotlib", "zoo": "torch"}
"""Each extra of pyproject.toml's ``[project.optional-dependencies]`` and the module that
tells whether it is installed."""


def missing_extra(extra: str, feature: str) -> str | None:
    """Why ``feature`` cannot run and how to fix it, or None when ``extra`` is installed."""
    module = EXTRAS[extra]
    if importlib.util.find_spec(module) is not None:
        return None
    return (f"{feature} needs {module}, which is not installed: "
            f"pip install '{DISTRIBUTION}[{extra}]'")
