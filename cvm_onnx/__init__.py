"""cvm-onnx: CVM integer models to ONNX and back, bit-exact on onnxruntime."""
__version__ = "0.1.0"
