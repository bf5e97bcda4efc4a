"""cvm-onnx: CVM integer models to ONNX and back, bit-exact on onnxruntime.

    import cvm_onnx
    model = cvm_onnx.load("resnet20-cifar")            # read + validate (symbol, params)
    onnx_model = cvm_onnx.to_onnx(model.graph)         # one cvm-domain function node per CVM op
    [y] = cvm_onnx.run_cvm(model.graph, x)             # the reference executor (FORMAL semantics)
    print(cvm_onnx.verify(model.graph))                # onnxruntime vs the executor, element for element
"""
import importlib.util
import sys
from pathlib import Path

from .constants import __version__


def _converters_from_checkout() -> None:
    """Make the checkout's top-level ``converters/`` folder the subpackage ``cvm_onnx.converters``, as the wheel
    installs it (pyproject ``wheel.packages``), when this package is imported from a source checkout that has no
    other way to it (e.g. a non-editable install shadowed by the checkout): one import graph either way."""
    if importlib.util.find_spec(f"{__name__}.converters") is not None:
        return
    folder = Path(__file__).resolve().parent.parent / "converters"
    spec = importlib.util.spec_from_file_location(f"{__name__}.converters", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    setattr(sys.modules[__name__], "converters", module)


_converters_from_checkout()

from .api import (Loaded, convert, from_onnx, import_onnx, load, load_onnx, run_cvm, to_onnx,  # noqa: E402
                  write_model, write_onnx)
from .verify import verify  # noqa: E402

__all__ = ["Loaded", "__version__", "convert", "from_onnx", "import_onnx", "load", "load_onnx", "run_cvm", "to_onnx",
           "verify", "write_model", "write_onnx"]
