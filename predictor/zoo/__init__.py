"""Model zoo: parametrised families in plain torch mirroring Horus Table 2, plus a
transformer encoder, exportable to ONNX on CPU at any batch size.

Importing this package does not import torch: each entry's ``build`` and
``example_input`` import their family module on first call, so that the extender
(which only reads ONNX files) never needs torch.

Training graphs: ``export_onnx(..., training=True)`` exports the *forward* graph
in training mode (dropout active, batch norm using batch statistics, no constant
folding). The backward pass and optimizer are not in the graph; the memory
estimate (``predictor.memory``, Horus Eq. 2) adds gradients and optimizer state
from the parameter bytes, and the utilisation model learns the training/inference
difference from the ``workload`` column of the profiles.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

ONNX_IR_VERSION = 10
"""IR version written into exported files: ONNX Runtime 1.31 reads at most 13."""
ONNX_OPSET = 17
_INPUT_KEYS = frozenset({"resolution", "seq_len", "vocab", "input_dim"})


@dataclass(frozen=True)
class ZooEntry:
    """One named model configuration: family, constructor and input factory."""

    name: str
    family: str
    kind: str
    """``cv`` (image batch), ``nlp`` (token ids) or ``fc`` (flat vectors)."""
    module: str
    cls: str
    params: Mapping[str, Any] = field(default_factory=dict)
    """Constructor defaults; ``build(**overrides)`` replaces any of them."""
    input_params: Mapping[str, Any] = field(default_factory=dict)
    """Input defaults (``resolution``, ``seq_len``, ``vocab``, ``input_dim``)."""

    def build(self, **params: Any) -> Any:
        """Construct the torch module (imports torch and the family module).

        Input parameters (``resolution``, ``seq_len``, ``vocab``, ``input_dim``) are
        passed on only where the constructor takes them; any other unknown name is
        a TypeError, so a typo never silently builds the default model.
        """
        mod = importlib.import_module(f"predictor.zoo.{self.module}")
        accepted = self._ctor_keys()
        unknown = sorted(set(params) - accepted - _INPUT_KEYS)
        if unknown:
            raise TypeError(f"{self.name}: unknown parameters {unknown}; takes {sorted(accepted)}")
        merged = {**self.params, **{k: v for k, v in params.items() if k in accepted}}
        return getattr(mod, self.cls)(**merged)

    def _ctor_keys(self) -> set[str]:
        import inspect

        mod = importlib.import_module(f"predictor.zoo.{self.module}")
        return set(inspect.signature(getattr(mod, self.cls)).parameters)

    def example_input(self, batch_size: int, **params: Any) -> Any:
        """A deterministic input batch of ``batch_size`` for this entry."""
        from predictor.zoo import _layers

        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        p = {**self.input_params, **params}
        if self.kind == "cv":
            return _layers.image_input(batch_size, int(p.get("resolution", 224)))
        if self.kind == "nlp":
            return _layers.token_input(batch_size, int(p["seq_len"]), int(p["vocab"]))
        import torch

        return torch.randn(
            batch_size, int(p["input_dim"]), generator=torch.Generator().manual_seed(0)
        )


def _cv(
    name: str, family: str, module: str, cls: str, resolution: int = 224, **params: Any
) -> ZooEntry:
    return ZooEntry(
        name,
        family,
        "cv",
        module,
        cls,
        MappingProxyType(params),
        MappingProxyType({"resolution": resolution}),
    )


def _entries() -> dict[str, ZooEntry]:
    e: list[ZooEntry] = [
        _cv("mobilenet_v1", "mobilenet", "mobile", "MobileNetV1"),
        _cv("mobilenet_v2", "mobilenet_v2", "mobile", "MobileNetV2"),
        _cv("mobilenet_v3_075", "mobilenet_v3", "mobile", "MobileNetV3", width=0.75),
        _cv("mobilenet_v3_100", "mobilenet_v3", "mobile", "MobileNetV3", width=1.0),
        _cv("googlenet", "googlenet", "residual", "GoogLeNet"),
        _cv("resnet18", "resnet", "residual", "ResNet", layers=(2, 2, 2, 2), bottleneck=False),
        _cv("resnet18_bottleneck", "resnet", "residual", "ResNet", layers=(2, 2, 2, 2)),
        _cv("resnet34", "resnet", "residual", "ResNet", layers=(3, 4, 6, 3), bottleneck=False),
        _cv("resnet50", "resnet", "residual", "ResNet", layers=(3, 4, 6, 3)),
        _cv("resnet101", "resnet", "residual", "ResNet", layers=(3, 4, 23, 3)),
        _cv("vgg11", "vgg", "residual", "VGG", depth=11),
        _cv("vgg19", "vgg", "residual", "VGG", depth=19),
        _cv("squeezenet1_0", "squeezenet", "mobile", "SqueezeNet"),
        _cv("densenet121", "densenet", "residual", "DenseNet", depth=121),
        _cv("densenet161", "densenet", "residual", "DenseNet", depth=161),
        _cv("densenet169", "densenet", "residual", "DenseNet", depth=169),
    ]
    e += [
        _cv(f"shufflenet_v2_{w}", "shufflenet_v2", "mobile", "ShuffleNetV2", width=w)
        for w in (0.5, 1.0, 1.5, 2.0)
    ]
    e += [_cv(f"mnasnet_{w}", "mnasnet", "mobile", "MNASNet", width=w) for w in (0.5, 1.0, 1.3)]
    e += [_cv(f"dpn{d}", "dpn", "residual", "DPNCifar", 32, depth=d) for d in (26, 92)]
    e += [
        _cv(
            f"resnext{d}_2x{w}d",
            "resnext",
            "residual",
            "ResNeXtCifar",
            32,
            depth=d,
            cardinality=2,
            width=w,
        )
        for d in (11, 29)
        for w in (16, 64)
    ]
    # Han et al.'s CIFAR settings: alpha 48/84/270 at depth 110, plus a shallower depth 56.
    e += [
        _cv(
            f"pyramidnet{d}_a{a}", "pyramidnet", "residual", "PyramidNetCifar", 32, depth=d, alpha=a
        )
        for d in (56, 110)
        for a in (48, 84, 270)
    ]
    nlp = MappingProxyType({"seq_len": 200, "vocab": 10000})
    for cell in ("lstm", "gru"):
        e.append(
            ZooEntry(
                cell, cell, "nlp", "sequence", "RecurrentLM", MappingProxyType({"cell": cell}), nlp
            )
        )
    e.append(
        ZooEntry(
            "mlp",
            "mlp",
            "fc",
            "sequence",
            "MLP",
            MappingProxyType({}),
            MappingProxyType({"input_dim": 784}),
        )
    )
    e.append(
        ZooEntry(
            "transformer_encoder",
            "transformer",
            "nlp",
            "sequence",
            "TransformerEncoder",
            MappingProxyType({}),
            MappingProxyType({"seq_len": 128, "vocab": 10000}),
        )
    )
    return {entry.name: entry for entry in e}


ZOO: Mapping[str, ZooEntry] = MappingProxyType(_entries())
"""Every zoo configuration by name (e.g. ``"resnet50"``)."""


def _entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}")
    return ZOO[name]


def build_model(name: str, **params: Any) -> Any:
    """The torch module of zoo model ``name``, sized for the input ``example_input`` makes.

    Input parameters (``resolution``, ``seq_len``, ``vocab``, ``input_dim``) start
    from the entry's defaults and ``params`` override them and constructor
    defaults. They reach the constructors that take them (VGG's classifier depends
    on the resolution, a language model's embedding on the vocabulary), so the
    model always accepts ``ZOO[name].example_input(batch, **params)``. The
    profiler's worker and ``export_onnx`` both build through here.
    """
    entry = _entry(name)
    return entry.build(**{**entry.input_params, **params})


def export_onnx(
    name: str,
    batch_size: int,
    path: Path | str,
    training: bool = False,
    dynamic_batch: bool = False,
    **params: Any,
) -> Path:
    """Export zoo model ``name`` to ONNX at ``batch_size`` on CPU; returns ``path``.

    ``params`` override constructor defaults (``width``, ``depth``, ``layers``,
    ``hidden``...) and input defaults (``resolution``, ``seq_len``, ``vocab``,
    ``input_dim``); vocabulary and input width are passed to both. With
    ``dynamic_batch`` the batch dimension is the symbolic ``batch``.
    """
    entry = _entry(name)
    input_params = {k: v for k, v in params.items() if k in _INPUT_KEYS}
    model = build_model(name, **params)
    example = entry.example_input(batch_size, **input_params)
    doc = f"tandem zoo {name} batch={batch_size} training={training} params={params}"
    return export_module(model, example, path, training, dynamic_batch, doc)


def export_module(
    model: Any,
    example: Any,
    path: Path | str,
    training: bool = False,
    dynamic_batch: bool = False,
    doc_string: str = "",
) -> Path:
    """Export a torch module on CPU to ONNX with input ``example``; returns ``path``.

    The one export the zoo and the profiler's user torch models share: TorchScript
    exporter, opset ``ONNX_OPSET``, IR ``ONNX_IR_VERSION``, input ``input`` and
    output ``output``, the batch dimension symbolic (``batch``) with
    ``dynamic_batch``.
    """
    import onnx
    import torch

    model.train(training)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated but ~50x faster than dynamo here; its
        # tracer warns (TracerWarning, a plain Warning) about shape-dependent Python
        # values that are constant for a fixed-shape export. None of it is actionable.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=False,
            opset_version=ONNX_OPSET,
            input_names=["input"],
            output_names=["output"],
            training=mode,
            do_constant_folding=not training,
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None,
        )
    proto = onnx.load(str(path))
    proto.ir_version = ONNX_IR_VERSION
    proto.doc_string = doc_string
    onnx.save(proto, str(path))
    return path


__all__ = ["ONNX_IR_VERSION", "ONNX_OPSET", "ZOO", "ZooEntry", "build_model", "export_module",
           "export_onnx"]


def family_names() -> list[str]:
    """Sorted distinct family names in the zoo."""
    return sorted({e.family for e in ZOO.values()})
