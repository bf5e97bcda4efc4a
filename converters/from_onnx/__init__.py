"""ONNX -> CVM: ``from_onnx`` imports an ONNX model as a validated CVM graph computing the same values.

Models written by the exporter (function form, flat form, native ops) come back exactly as the CVM graph they
came from; standard integer ONNX graphs are imported op by op (one rule per ONNX op type, by family: elemwise,
nn, transform, reduce) where an exact CVM form exists; models quantized by onnxruntime.quantization (QDQ and
QOperator forms) through the quantized front (``quantized``). See docs/import.md.
"""
from .importer import Imported, batch_of_one, cut, from_onnx, import_model
from .registry import RULES, Refuse, rule
from .roundtrip import source_symbol

__all__ = ["Imported", "batch_of_one", "cut", "from_onnx", "import_model", "RULES", "Refuse", "rule", "source_symbol"]
