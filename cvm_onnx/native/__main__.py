"""``python -m cvm_onnx.native``: the native library's path, for ``SessionOptions.register_custom_ops_library``."""
import sys

from . import library_path, status

if (path := library_path()) is None:
    sys.exit(status())
print(path)
