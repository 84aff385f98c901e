"""Loading the extender's config and holding the live one.

Loading goes: read YAML -> apply ``TANDEM__SECTION__KEY=value`` environment
overrides (values parsed as YAML scalars) -> validate everything and build frozen
dataclasses (:func:`extender.config.schema.build_config`) -> only then replace the
live config (:class:`ConfigHolder`). A bad edit during hot reload keeps the old
config and reports the problems.

One rule for every key: what a file leaves out takes its packaged default
(``default_config.yaml``). ``cost.curves`` is a map, so it is merged per GPU type: a
file's own curves (and its ``cost.curves_file``'s) win for the types they name, and
the packaged curves stay for every other type.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from extender.config.schema import ConfigError, build_config
from extender.config.sections import ExtenderConfig
from extender.core import CostPolicy
from predictor.curves import InterferenceCurve

ENV_PREFIX = "TANDEM__"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "default_config.yaml"


def apply_env(raw: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``TANDEM__SECTION__KEY[__SUB]=value`` variables (YAML scalars) onto ``raw``."""
    merged: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not path:
            continue
        node = merged
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = dict(child) if isinstance(child, Mapping) else {}
                node[part] = child
            node = child
        try:
            node[path[-1]] = yaml.safe_load(text)
        except yaml.YAMLError:
            node[path[-1]] = text
    return merged


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None,
                ) -> ExtenderConfig:
    """Load ``path`` (or the packaged default), apply env overrides, validate."""
    file = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        with file.open(encoding="utf-8") as stream:  # YAML errors then name the file
            raw = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{file}: not valid YAML: {exc}"]) from None
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError([f"{file}: top level must be a mapping"])
    raw = apply_env(raw or {}, os.environ if environ is None else environ)
    config = build_config(raw, str(file))
    packaged = packaged_curves()
    if all(t in config.policy.curves for t in packaged):
        return config
    return replace(config, policy=replace(
        config.policy, curves={**packaged, **config.policy.curves}))


@cache
def packaged_curves() -> dict[str, InterferenceCurve]:
    """The per-GPU-type curves of ``default_config.yaml``, the layer under every file's."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    return dict(build_config({"cost": raw["cost"]}, str(DEFAULT_CONFIG)).policy.curves)


class ConfigHolder:
    """The live config, swapped atomically on reload; readers call ``current()``."""

    def __init__(self, config: ExtenderConfig, loader: Callable[[], ExtenderConfig] | None = None):
        self._config = config
        self._loader = loader
        self._lock = threading.Lock()
        self._mtime = _mtimes(config)

    def current(self) -> ExtenderConfig:
        """The config in force now (a frozen value; never mutated)."""
        return self._config

    def policy(self) -> CostPolicy:
        """The decision policy in force now."""
        return self._config.policy

    def reload_if_changed(self) -> list[str] | None:
        """Reload when the file (or its curves file) changed; problems (old kept) or None."""
        mtime = _mtimes(self._config)
        if self._loader is None or mtime == self._mtime:
            return None
        with self._lock:
            self._mtime = mtime
            try:
                new = self._loader()
            except ConfigError as exc:
                return exc.problems
            self._config = new
            self._mtime = _mtimes(new)  # the new config may name another curves file
            return []


def _mtimes(config: ExtenderConfig) -> tuple[float | None, ...]:
    return tuple(_mtime(p) for p in (config.source_path, config.curves_file))


def _mtime(path: str | None) -> float | None:
    try:
        return os.stat(path).st_mtime_ns if path else None
    except OSError:
        return None
