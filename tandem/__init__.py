"""The composition root: the ``tandem`` command and ``tandem demo``.

The only package that imports both deployables (``extender`` and ``agent``); they
in turn share ``planner``, ``predictor`` and ``contracts`` and never import each
other (``lint-imports`` enforces the layers, see docs/architecture.md).
"""
