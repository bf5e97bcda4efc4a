"""A float ONNX model to CVM: onnxruntime.quantization's static quantizer and calibrators, then the importer.

``quantize(F.onnx, C.npy, DIR)`` calibrates on the N samples stacked on axis 0 of C.npy (the model takes batch 1;
``method``: minmax, entropy or percentile), writes the int8 model onnxruntime.quantization.quantize_static makes
(QDQ or QOperator form, activations uint8 or int8, symmetric or not, weights int8 per tensor or per channel),
imports it as the CVM model DIR with its float edges (``quantization.json``), and compares the CVM model with
the float model on the calibration samples, output by output. No calibration code of our own: the calibrators
are onnxruntime's.
"""
from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from cvm_onnx.converters.from_onnx import Imported
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.npy import read_npy
from cvm_onnx.runtime.bulk import run_many

from .api import convert, load_onnx

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Agreement:
    """One output, CVM against the float model on the calibration samples: top-1 agreement (argmax over the last
    axis, when it has more than one element) and the absolute difference in output steps."""

    name: str
    top1: float | None
    mean_steps: float
    max_steps: float
    within_one_step: float

    def line(self) -> str:
        top = "" if self.top1 is None else f"top-1 agreement {self.top1:.2%}, "
        return (f"{self.name}: {top}|CVM - float| mean {self.mean_steps:.2f}, max {self.max_steps:.1f} output "
                f"steps; {self.within_one_step:.2%} of elements within one step")


@dataclass(frozen=True)
class Quantized:
    """What ``quantize`` made: the import (graph, edges, requantizations) and the agreement per output."""

    imported: Imported
    agreements: list[Agreement]
    samples: int


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over the samples, one feed per sample, counting them."""

    def __init__(self, name: str, samples: np.ndarray, shape: tuple[int, ...], progress: Progress | None):
        self.name, self.samples, self.shape, self.progress = name, samples, shape, progress
        self.i = 0

    def get_next(self):
        if self.i >= len(self.samples):
            return None
        feed = {self.name: np.asarray(self.samples[self.i], np.float32).reshape(self.shape)}
        self.i += 1
        if self.progress:
            self.progress(self.i, len(self.samples), "calibrating")
        return feed

    def rewind(self):
        self.i = 0


def _input(model: onnx.ModelProto) -> tuple[str, tuple[int, ...]]:
    inits = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in inits]
    if len(inputs) != 1:
        raise UnsupportedError(f"the model has {len(inputs)} inputs; CVM takes one")
    dims = inputs[0].type.tensor_type.shape.dim
    if not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
        raise UnsupportedError("the input needs a static shape (batch 1)", where=inputs[0].name)
    return inputs[0].name, tuple(d.dim_value for d in dims)


def _calibration(path: str | os.PathLike, shape: tuple[int, ...]) -> np.ndarray:
    data = read_npy(path, "the calibration samples", mmap=False)
    one = shape[1:] if shape and shape[0] == 1 else shape
    if data.dtype.kind != "f" or tuple(data.shape[1:]) not in (one, shape) or len(data) == 0:
        raise FormatError(f"calibration samples must be floats of shape (N, {', '.join(map(str, one))}) (N >= 1), "
                          f"got {data.dtype} {data.shape}", where=os.fspath(path))
    return data.reshape((len(data),) + shape)


def quantize(src: str | os.PathLike, calibration: str | os.PathLike, dst: str | os.PathLike,
             per_channel: bool = False, symmetric: bool = False, method: str = "minmax",
             activation: str = "uint8", form: str = "qdq", save_onnx: str | os.PathLike | None = None,
             progress: Progress | None = None) -> Quantized:
    """Quantize the float model ``src`` with onnxruntime.quantization.quantize_static calibrated on
    ``calibration`` (N samples on axis 0), import it as the CVM model ``dst`` (with ``quantization.json``), and
    compare it with the float model on those samples. ``save_onnx``: also keep the quantized ONNX model there."""
    from onnxruntime import InferenceSession
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if method not in METHODS:
        raise UnsupportedError(f"calibration method {method!r}: one of {', '.join(METHODS)}")
    model = load_onnx(src)
    name, shape = _input(model)
    samples = _calibration(calibration, shape)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(save_onnx) if save_onnx is not None else Path(tmp) / "quantized.onnx"
        quiet = logging.root.manager.disable
        logging.disable(logging.WARNING)  # quantize_static's advice to pre-process the model, on every call
        try:
            quantize_static(
                os.fspath(src), os.fspath(out), _Reader(name, samples, shape, progress),
                quant_format=QuantFormat.QOperator if form == "qoperator" else QuantFormat.QDQ,
                activation_type=QuantType.QInt8 if activation == "int8" else QuantType.QUInt8,
                weight_type=QuantType.QInt8, per_channel=per_channel,
                calibrate_method=getattr(CalibrationMethod, METHODS[method]),
                extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
        except Exception as e:  # noqa: BLE001  (onnxruntime.quantization raises anything)
            raise RuntimeFailure(f"onnxruntime.quantization.quantize_static failed: {type(e).__name__}: {e}",
                                 where=os.fspath(src)) from None
        finally:
            logging.disable(quiet)
        imported = convert(out, dst)
    floats = InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = [np.stack([floats.run(None, {name: x})[k] for x in samples]) for k in range(len(floats.get_outputs()))]
    got = run_many(imported.graph, samples.astype(np.float32), edges=imported.edges, progress=progress).arrays
    agreements = [_agreement(o.name, g, w, e) for o, g, w, e in
                  zip(floats.get_outputs(), got, want, imported.edges.outputs if imported.edges else [])]
    return Quantized(imported, agreements, len(samples))


def _agreement(name: str, got: np.ndarray, want: np.ndarray, edge) -> Agreement:
    got, want = got.reshape(want.shape).astype(np.float64), want.astype(np.float64)
    step = float(np.max(edge.scale)) if edge is not None else 1.0
    diff = np.abs(got - want) / step
    top1 = None
    if want.shape[-1] > 1:
        top1 = float((got.reshape(len(got), -1, want.shape[-1]).argmax(-1) ==
                      want.reshape(len(want), -1, want.shape[-1]).argmax(-1)).mean())
    return Agreement(name, top1, float(diff.mean()), float(diff.max()), float((diff <= 1).mean()))
