"""cvm-onnx: CVM integer models to ONNX and back, bit-exact on onnxruntime.

    import cvm_onnx
    model = cvm_onnx.load("resnet20-cifar")            # read + validate (symbol, params)
    onnx_model = cvm_onnx.to_onnx(model.graph)         # one cvm-domain function node per CVM op
    served = cvm_onnx.to_onnx(model.graph, cvm_onnx.Target.native())  # the serving form for this machine
    [y] = cvm_onnx.run_cvm(model.graph, x)             # the reference executor (FORMAL semantics)
    print(cvm_onnx.verify(model.graph))                # onnxruntime vs the executor, element for element

The names are imported when first used, so that importing the package (and starting the command line) does not
load onnx and onnxruntime.
"""
from __future__ import annotations

from cvm_onnx.core.constants import __version__

_API = ("Loaded", "convert", "from_onnx", "import_onnx", "load", "load_onnx", "pack_inputs", "run_cvm", "to_onnx",
        "write_model", "write_onnx")


def __getattr__(name: str):
    if name == "verify":
        from cvm_onnx.runtime.verify import verify as value
    elif name == "Target":
        from cvm_onnx.serving.target import Target as value
    elif name in _API:
        from cvm_onnx.app import api

        value = getattr(api, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, "Target", "verify"])


__all__ = ["Loaded", "Target", "__version__", "convert", "from_onnx", "import_onnx", "load", "load_onnx",
           "pack_inputs", "run_cvm", "to_onnx", "verify", "write_model", "write_onnx"]
