"""The executors (ONNX Runtime, sim, torch over its ONNX interpreter): the only code that
runs models on the device.
"""
