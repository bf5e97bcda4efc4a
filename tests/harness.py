"""Shared test helpers: random int tensors at the precision extremes, and the exactness check ORT == reference."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import run


def bound(p: int) -> int:
    return (1 << (p - 1)) - 1


def tensors(shape, precision: int):
    """int32 arrays of ``shape`` within +-(2^(p-1)-1), biased to the extremes and zero."""
    b = bound(precision)
    elems = st.one_of(st.sampled_from(sorted({b, -b, 0, min(b, 1), -min(b, 1)})), st.integers(-b, b))
    return hnp.arrays(np.int32, tuple(shape), elements=elems)


shapes = hnp.array_shapes


def single_op(op: str, inputs: list[tuple[np.ndarray, int, bool]], **attrs):
    """A graph computing one op; each input is (value, precision, is_param). Returns (graph, feeds)."""
    b = GraphBuilder()
    entries, feeds = [], {}
    for k, (value, p, is_param) in enumerate(inputs):
        if is_param:
            entries.append(b.param(f"w{k}", value, p))
        else:
            name = "data" if k == 0 else f"in{k}"
            entries.append(b.input(name, value.shape, p))
            feeds[name] = value
    out = b.op(op, *entries, name=op, **attrs)
    heads = out if isinstance(out, tuple) else (out,)
    return b.build(*heads), feeds


def assert_exact(graph, feeds, inline: bool = False) -> list[np.ndarray]:
    """Export ``graph``, check the model, run it on onnxruntime and compare every output bit for bit."""
    model = to_onnx(graph, inline=inline)
    onnx.checker.check_model(model, full_check=True)
    want = execute(graph, feeds)
    got = run(model, feeds)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == np.int32 and w.dtype == np.int32
        assert g.shape == w.shape, (g.shape, w.shape)
        if not np.array_equal(g, w):
            bad = np.argwhere(g != w)[:5]
            raise AssertionError(f"ORT differs from the reference at {bad.tolist()}: "
                                 f"got {[g[tuple(i)] for i in bad]}, want {[w[tuple(i)] for i in bad]}")
    return got


@functools.cache
def operator_cases() -> dict:
    """docs/make_operators.py's CASES: for every op, (title, graph) pairs reaching each of its ONNX forms."""
    path = Path(__file__).parents[1] / "docs" / "make_operators.py"
    spec = importlib.util.spec_from_file_location("make_operators", path)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    return make.CASES
