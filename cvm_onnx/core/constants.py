"""Facts both sides of the converter share, with no imports: the package version, the ONNX versions and domain
the exporter writes, every metadata key of an exported model, and the integer limits every rule is stated in.

Every module may import this one (it imports nothing of the package), so the version and the bounds have one
home that the core (``cvm_onnx``) and the converters (``cvm_onnx.converters``) read without an import cycle.
pyproject.toml reads ``__version__`` from here.
"""
__version__ = "0.1.0"

#: The ONNX opset of every exported model: the newest that every onnx and onnxruntime pyproject.toml declares
#: reads, fixed (never the installed onnx's newest) so an export is the same bytes under each of them; the IR
#: version that opset needs (``format.onnx_file.ir_version``); the domain of its CVM op nodes and functions.
OPSET = 21
IR_VERSION = 10
DOMAIN = "cvm"
DOMAIN_VERSION = 1  # its version in opset_import
#: Metadata of an exported model holding the text of the symbol file it was converted from (format.pack_symbol).
SYMBOL = "cvm.symbol.zlib"
#: Metadata of a batched exported model: its batch size (``cvm_onnx.runtime.bulk`` splits a call's outputs by it).
BATCH = "cvm.batch"
#: Metadata of a model exported from a quantized import: its float edges, the text of its ``quantization.json``.
QUANTIZATION = "cvm.quantization"
#: Metadata of such a model exported with its float edges in the graph (float input and outputs): the same text.
FLOAT_IO = "cvm.float_io"
#: Metadata of a serving-form model: each conv2d's route, a JSON list of [name, route, why not integer products].
ROUTES = "cvm.routes"
#: Metadata of a serving-form model: the provider it was made for, "cpu" or "cuda" (every node a CUDA kernel).
PROVIDER = "cvm.provider"
#: Metadata of a serving-form model: the target it was made for (``cvm_onnx.serving.target.Target``), JSON.
TARGET = "cvm.target"
#: Metadata of a tensor (value_info) of an exported model: its CVM precision (an input's is on ``<input>:clamped``).
PRECISION = "cvm.precision"
#: Metadata of a serving-form model: the fused runs and the passes it went through (not importable back).
OPTIMIZED = "cvm.optimized"
#: Metadata of an exported model: the format it was converted from ("CVM") and the CVM model's version.
CONVERTED_FROM, SOURCE_VERSION = "converted_from", "cvm.version"
#: Metadata of an exported model that calls the native custom-op library: the library and how to find it.
NATIVE_LIBRARY = "cvm.native_library"
#: Metadata of each node of the flat form: the CVM node, op, attributes (JSON) and input tensors (JSON) it lowers.
MARK_NODE, MARK_OP, MARK_ATTRS, MARK_INPUTS = "cvm.node", "cvm.op", "cvm.attrs", "cvm.inputs"
#: Metadata of each node of a fused requantization run: the CVM nodes it computes and their ops (JSON lists).
MARK_FUSED, MARK_OPS = "cvm.fused", "cvm.ops"
#: Metadata of a fused convolution that runs the requantization run it reads (its in_steps): that run's marks (JSON).
MARK_IN_RUN = "cvm.in_run"

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
#: Samples per unit of work of ``run`` by default (``cvm_onnx.runtime.bulk``), the batch of the README's batched
#: ResNet-20 figures.
CHUNK = 64
#: A bound on |x| that any int32 satisfies, INT32_MIN included.
ANY = 1 << 31
#: Every integer of magnitude <= 2^24 is a float32 (24-bit significand), <= 2^53 a float64.
FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53


def precision_of(text: str) -> int | None:
    """The precision a ``cvm.precision`` metadata value states (a decimal integer in [1, 32]), else None."""
    return int(text) if text in {str(p) for p in range(1, 33)} else None


def tight(peak: int) -> int:
    """The smallest precision holding every |x| <= peak (peak >= 0): bits(peak) + 1, the sign included."""
    return int(peak).bit_length() + 1


def precision_bound(precision: int) -> int:
    """The largest magnitude of a value of precision p (p bits, sign included): 2^(p-1)-1."""
    return (1 << (precision - 1)) - 1
