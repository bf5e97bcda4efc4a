"""Converters between CVM graphs and ONNX models (installed as ``cvm_onnx.converters``)."""
