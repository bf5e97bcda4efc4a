"""Shared test support: strategies (random int tensors at the precision extremes, random graphs), graph builders,
the exactness check ORT == reference, the documented op cases and the int32 limits. Test files import from here
(``support`` and its modules ``oracles``, ``fuzz``, ``quantized``), never from one another."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.constants import INT32_MAX, INT32_MIN  # noqa: F401  (the tests read them from here)
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import run


#: onnxruntime-extensions, which the pure-Python fallback of the cvm.native ops needs (the extra fallback; .ci/run
#: installs it, so that CI runs the tests marked with this).
HAS_FALLBACK = importlib.util.find_spec("onnxruntime_extensions") is not None
needs_fallback = pytest.mark.skipif(not HAS_FALLBACK, reason="the pure-Python fallback needs onnxruntime-extensions "
                                    "(the extra fallback: pip install onnxruntime-extensions)")


def bound(p: int) -> int:
    return (1 << (p - 1)) - 1


def tensors(shape, precision: int):
    """int32 arrays of ``shape`` within +-(2^(p-1)-1), biased to the extremes and zero."""
    b = bound(precision)
    elems = st.one_of(st.sampled_from(sorted({b, -b, 0, min(b, 1), -min(b, 1)})), st.integers(-b, b))
    return hnp.arrays(np.int32, tuple(shape), elements=elems)


def values(shape, p: int):
    """int32 arrays within precision p, with the edges +-(2^(p-1)-1), +-(2^(p-1)-2), +-1 and 0 drawn often."""
    r = bound(p)
    edges = st.sampled_from(sorted({v for v in (-r, -r + 1, -1, 0, 1, r - 1, r) if -r <= v <= r}))
    return hnp.arrays(np.int32, shape, elements=st.one_of(edges, st.integers(-r, r)))


@st.composite
def reduce_case(draw):
    """sum or max, a shape, valid attributes (axes in any order, some negative) and data within a precision."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    nd = len(shape)
    axes = draw(st.lists(st.integers(0, nd - 1), unique=True, max_size=nd))
    axis = tuple(i - nd if draw(st.booleans()) else i for i in axes)
    p = draw(st.integers(1, 32))
    attrs = dict(axis=axis, keepdims=draw(st.booleans()), exclude=draw(st.booleans()))
    return draw(st.sampled_from(["sum", "max"])), attrs, p, draw(values(shape, p))


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


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Outputs equal bit for bit: as many, each of the same type and shape."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w)


def assert_exact(graph, feeds, inline: bool = False, **export) -> list[np.ndarray]:
    """Export ``graph`` (``export``: more arguments of ``to_onnx``), check the model, run it on onnxruntime and
    compare every output bit for bit."""
    model = to_onnx(graph, inline=inline, **export)
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
    path = Path(__file__).parents[2] / "docs" / "make_operators.py"
    spec = importlib.util.spec_from_file_location("make_operators", path)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    return make.CASES


# -- random multi-op graphs ---------------------------------------------------------------------------------------
UNARY = ["relu", "abs", "negative", "cvm_precision"]


@st.composite
def graphs(draw):
    """A random chain-and-merge graph over a 4-D input, every precision kept within the runtime's rules by
    requantizing (cvm_right_shift) wherever a value grows past 16 bits, and feeding conv2d/dense 8-bit inputs."""
    b = GraphBuilder()
    c = draw(st.integers(1, 3))
    h = draw(st.integers(2, 5))
    x = b.input("data", (1, c, h, h), 8)
    live = [(x, (1, c, h, h), 8)]
    for k in range(draw(st.integers(1, 6))):
        e, shape, p = live[draw(st.integers(0, len(live) - 1))]
        kind = draw(st.sampled_from(["unary", "shift", "conv", "add", "mul", "pool", "clip"]))
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            y, q = b.op(op, e), (6 if op == "cvm_precision" else p)
        elif kind == "shift" or p > 16:
            s = draw(st.integers(1, max(1, p - 1)))
            y, q = b.op("cvm_right_shift", e, precision=8, shift_bit=s), 8
        elif kind == "conv":
            if p > 8:
                e, p = b.op("cvm_clip", e, precision=8), 8
            oc = draw(st.integers(1, 3))
            w = draw(tensors((oc, shape[1], 3, 3), 8))
            bias = draw(tensors((oc,), 12))
            y = b.op("conv2d", e, b.param(f"w{k}", w, 8), b.param(f"b{k}", bias, 12), channels=oc,
                     kernel_size=(3, 3), padding=(1, 1))
            shape, q = (1, oc, shape[2], shape[3]), 8 + 8 + (shape[1] * 9).bit_length() + 1
            q = max(q, 13)
        elif kind == "add":
            y, q = b.op("elemwise_add", e, e), p + 1
        elif kind == "mul":
            y, q = b.op("broadcast_mul", e, b.param(f"m{k}", np.array([draw(st.integers(-100, 100))]), 8)), p + 8
        elif kind == "pool" and shape[2] >= 2:
            y = b.op("max_pool2d", e, pool_size=(2, 2), strides=(1, 1))
            shape = (1, shape[1], shape[2] - 1, shape[3] - 1)
            q = p
        else:
            y, q = b.op("cvm_clip", e, precision=draw(st.integers(1, 8))), 8
        live.append((y, shape, q))
    heads = [live[-1][0]] + ([live[draw(st.integers(0, len(live) - 1))][0]] if draw(st.booleans()) else [])
    graph = b.build(*heads)
    return graph, {"data": draw(tensors((1, c, h, h), 9))}
def _nodes(graph: onnx.GraphProto):
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.HasField("g") else list(a.graphs):
                yield from _nodes(g)


def readable_node_test(model: onnx.ModelProto, data=None) -> onnx.ModelProto | None:
    """One of onnx's backend node test models at the newest ai.onnx opset the installed onnx and onnxruntime read,
    with the IR version that opset needs: onnx stamps every node test with its own newest opset and IR version,
    whatever op it tests. Where a node's op has a newer version than that opset, the model at the older one must
    pass onnx's checker (full_check) and, given the test's ``data`` (inputs, outputs), onnx's reference
    implementation of the older version must give the test's outputs; else None (this onnxruntime cannot run
    the test)."""
    from onnx.reference import ReferenceEvaluator

    from cvm_onnx.converters.from_onnx.checks import supported_versions
    from cvm_onnx.core.format.onnx_file import ir_version

    target = supported_versions()[1]
    default = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    have = default[0].version if default else target
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = min(have, target)
    out.ir_version = ir_version(out.opset_import)
    if have > target and any(n.domain in ("", "ai.onnx") and onnx.defs.get_schema(n.op_type, have).since_version
                             > target for n in _nodes(model.graph)):
        try:
            onnx.checker.check_model(out, full_check=True)
            if data is not None:
                inputs, outputs = data
                got = ReferenceEvaluator(out).run(None, dict(zip([i.name for i in out.graph.input], inputs)))
                if not all(np.array_equal(g, w) for g, w in zip(got, outputs)):
                    return None
        except Exception:  # noqa: BLE001  (the older version refuses the test: it is not one this onnxruntime runs)
            return None
    return out
