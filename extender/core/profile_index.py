"""Batching profiles found by a model's name, path or file name. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["ProfileIndex", "profile_keys"]


def profile_keys(model: str) -> tuple[str, ...]:
    """Names a model may have in the profile store: as given, then its file stem."""
    stem = model.rstrip("/").rsplit("/", 1)[-1]
    stem = stem[: -len(".onnx")] if stem.endswith(".onnx") else stem
    return (model,) if stem == model else (model, stem)


class ProfileIndex(Mapping[tuple[str, str], Any]):
    """Batching profiles keyed ``(model, gpu_type)`` that also answer for a model's
    path or file name (``models/resnet50.onnx`` finds the ``resnet50`` profile)."""

    def __init__(self, profiles: Mapping[tuple[str, str], Any]):
        self._profiles = dict(profiles)

    def __getitem__(self, key: tuple[str, str]) -> Any:
        model, gpu_type = key
        for name in profile_keys(model):
            if (name, gpu_type) in self._profiles:
                return self._profiles[(name, gpu_type)]
        raise KeyError(key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._profiles)

    def __len__(self) -> int:
        return len(self._profiles)
