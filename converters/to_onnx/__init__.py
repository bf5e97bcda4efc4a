"""CVM -> ONNX: lowerings of the CVM ops (one module per family) and the model exporter."""
from cvm_onnx.core.constants import DOMAIN, IR_VERSION, OPSET

from .export import Export, entry_names, to_onnx
from .lowering import LOWERINGS

__all__ = ["Export", "to_onnx", "entry_names", "DOMAIN", "IR_VERSION", "LOWERINGS", "OPSET"]
