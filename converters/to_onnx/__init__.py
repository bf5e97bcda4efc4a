"""CVM -> ONNX: lowerings of the 37 CVM ops (one module per family) and the model exporter."""
from .export import to_onnx
from .lowering import DOMAIN, IR_VERSION, LOWERINGS, OPSET

__all__ = ["to_onnx", "DOMAIN", "IR_VERSION", "LOWERINGS", "OPSET"]
