"""The sha256 of the exported bytes of every example model, of ResNet-20 and of the side-by-side's quantized
network (benchmarks/quantized_side_by_side.py's, quantized as it does, imported in one part and in two parts), in
five forms: function, flat (--inline), serving (--optimize), serving batched (--optimize --batch 4) and this
machine's serving form (--target native: the same bytes on machines of the same Target only).

Two runs print the same lines exactly when the exports are byte for byte the same, e.g. before and after a
refactoring. It converts through the public ``cvm_onnx.convert`` (the pipeline's stages and the file writer),
so it runs on any checkout whose package is importable (PYTHONPATH=checkout, with the native library built or
copied into its cvm_onnx/ folder: whether the serving form may take integer products depends on it, and the
header line says which).
Run: python benchmarks/export_digest.py [RESNET_DIR] (default: $CVM_RESNET20, else ../shared/models/resnet20-cifar
relative to the repository)
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import cvm_onnx

REPO = Path(__file__).resolve().parent.parent
FORMS = {"function": {}, "--inline": {"inline": True}, "--optimize": {"optimize": True},
         "--optimize --batch 4": {"optimize": True, "batch": 4}, "--target native": {"target": "native"}}


def digest(src: Path, form: dict) -> str:
    """The sha256 of the .onnx file ``convert`` writes, or the class of the error that refused it."""
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "m.onnx"
        try:
            cvm_onnx.convert(src, dst, **form)
        except Exception as e:  # noqa: BLE001  (a refusal is part of what is compared)
            return f"refused ({type(e).__name__})"
        return hashlib.sha256(dst.read_bytes()).hexdigest()


def main() -> None:
    resnet = Path(sys.argv[1] if len(sys.argv) > 1 else
                  os.environ.get("CVM_RESNET20", REPO.parent / "shared" / "models" / "resnet20-cifar"))
    models = sorted(p for p in (REPO / "models").iterdir() if (p / "symbol").is_file()) + [resnet]
    from cvm_onnx import native  # the same module before and after the layer move
    print(f"cvm-onnx {cvm_onnx.__version__}, native library: {'built' if native.library_path() else 'absent'}")
    with tempfile.TemporaryDirectory() as tmp:
        models += side_by_side(Path(tmp))
        for model in models:
            for name, form in FORMS.items():
                print(f"{model.name:22} {name:22} {digest(model, form)}", flush=True)


def side_by_side(tmp: Path) -> list[Path]:
    """The side-by-side's network quantized as benchmarks/quantized_side_by_side.py quantizes it (its first 64
    calibration images, QDQ, uint8 activations, weights per channel), imported in one part and in two parts: the
    two model directories."""
    import logging

    import numpy as np
    import onnx

    from cvm_onnx.app.quantize import quantize
    from quantized_side_by_side import resnet20  # benchmarks/ is the script's folder on sys.path

    logging.disable(logging.WARNING)
    rng = np.random.default_rng(0)
    onnx.save(resnet20(rng), tmp / "float.onnx")
    np.save(tmp / "calibration.npy", rng.normal(size=(64, 3, 32, 32)).astype(np.float32))
    quantize(tmp / "float.onnx", tmp / "calibration.npy", tmp / "side_by_side_q", form="qdq",
             save_onnx=tmp / "qdq.onnx", per_channel=True, activation="uint8")
    dirs = []
    for name, two_part in (("side-by-side-1part", False), ("side-by-side-2parts", True)):
        cvm_onnx.convert(tmp / "qdq.onnx", tmp / name, two_part=two_part)
        dirs.append(tmp / name)
    return dirs


if __name__ == "__main__":
    main()
