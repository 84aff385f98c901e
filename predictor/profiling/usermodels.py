"""User torch models: resolving a :class:`TorchModelSpec` into a module and its inputs.

The profiler's parent process resolves every factory before the campaign starts
(:func:`factory_problems`), so a typo costs a clear error instead of a row of
failed runs per batch size; the workers build the model again in their own
process, and the graph features come from exporting the same module to ONNX.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from predictor.profiling.backend import TorchModelSpec


class UserModelError(Exception):
    """A user torch model cannot be built; the message says which and why."""


def load_factory(ref: str) -> Callable[[], Any]:
    """The callable ``ref`` names (``module:callable`` or ``file.py:callable``)."""
    module_ref, _, attr = ref.rpartition(":")
    try:
        if module_ref.endswith(".py"):
            path = Path(module_ref)
            if not path.is_file():
                raise UserModelError(f"factory {ref!r}: no such file {module_ref!r}")
            # A stable, unique module name per file, so two files named model.py coexist.
            name = "tandem_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            module = importlib.import_module(module_ref)
    except UserModelError:
        raise
    except Exception as exc:  # the user's module failed to import: say so, with its error
        raise UserModelError(f"factory {ref!r}: cannot import {module_ref!r}: "
                             f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserModelError(f"factory {ref!r}: {module_ref!r} has no callable {attr!r}")
    return factory


def build_module(spec: TorchModelSpec) -> Any:
    """Call the factory; the result must be a ``torch.nn.Module``."""
    import torch

    model = load_factory(spec.factory)()
    if not isinstance(model, torch.nn.Module):
        raise UserModelError(f"factory {spec.factory!r} returned {type(model).__name__}, "
                             "not a torch.nn.Module")  # fmt: skip
    return model


def example_input(spec: TorchModelSpec, batch_size: int) -> Any:
    """A deterministic random batch ``(batch_size, *input_shape)`` of the spec's dtype."""
    import torch

    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    shape = (batch_size, *spec.input_shape)
    dtype = getattr(torch, spec.input_dtype)
    generator = torch.Generator().manual_seed(0)
    if dtype in (torch.int64, torch.int32):
        return torch.randint(0, spec.input_high, shape, generator=generator, dtype=dtype)
    return torch.randn(shape, generator=generator).to(dtype)


def factory_problems(models: Iterable[tuple[str, TorchModelSpec]]) -> list[str]:
    """``name: reason`` for every ``(name, spec)`` whose factory does not resolve."""
    out = []
    for name, spec in models:
        try:
            load_factory(spec.factory)
        except UserModelError as exc:
            out.append(f"torch_models.{name}: {exc}")
    return out
