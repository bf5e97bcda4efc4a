"""cvm-onnx: CVM integer models to ONNX and back, bit-exact on onnxruntime.

    import cvm_onnx
    model = cvm_onnx.load("resnet20-cifar")            # read + validate (symbol, params)
    onnx_model = cvm_onnx.to_onnx(model.graph)         # one cvm-domain function node per CVM op
    served = cvm_onnx.to_onnx(model.graph, cvm_onnx.Target.native())  # the serving form for this machine
    [y] = cvm_onnx.run_cvm(model.graph, x)             # the reference executor (FORMAL semantics)
    print(cvm_onnx.verify(model.graph))                # onnxruntime vs the executor, element for element
"""
from cvm_onnx.app.api import (
                              Loaded,
                              convert,
                              from_onnx,
                              import_onnx,
                              load,
                              load_onnx,
                              run_cvm,
                              to_onnx,
                              write_model,
                              write_onnx,
)
from cvm_onnx.core.constants import __version__
from cvm_onnx.runtime.verify import verify
from cvm_onnx.serving.target import Target

__all__ = ["Loaded", "Target", "__version__", "convert", "from_onnx", "import_onnx", "load", "load_onnx", "run_cvm",
           "to_onnx", "verify", "write_model", "write_onnx"]
