"""Horus prediction engine: ONNX graph features, memory estimate, utilisation model,
interference curves and batching profiles."""
