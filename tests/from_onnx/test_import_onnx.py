"""The importer on standard ONNX graphs built with onnx.helper: each op's model runs on onnxruntime and, after
import, on the reference executor, with equal results bit for bit (hypothesis over shapes and values at the
precision extremes); convolution and pooling with asymmetric pads and every auto_pad mode; what cannot be
imported is reported all at once, naming each node and the reason."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from support import bound, tensors

from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate

SETTINGS = settings(max_examples=12, deadline=None)
NP = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT32: np.int32, T.INT64: np.int64, T.FLOAT: np.float32}


def model(nodes, x_shape, out_type=T.INT32, x_type=T.INT32, inits=(), opset=17, outputs=("y",)):
    """A model with the input ``x`` and the outputs ``outputs`` (of ``out_type``)."""
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", x_type, list(x_shape))],
        [helper.make_tensor_value_info(o, out_type, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return onnx_model(graph, opset)


def node(op, ins, out="y", **attrs):
    outs = [out] if isinstance(out, str) else list(out)
    return helper.make_node(op, list(ins), outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def check(m, x, precision=8) -> Graph:
    """onnxruntime's outputs == the imported graph's on the reference executor (a scalar comes back as (1,))."""
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    graph = from_onnx(m, input_precision=precision)
    assert validate(graph).warnings == []  # nothing the runtime's devices compute differently
    got = execute(graph, {"data": x.astype(np.int32)})
    assert len(got) == len(want)
    for w, g in zip(want, got):
        w = np.asarray(w)
        assert g.dtype == np.int32 and g.shape == (w.shape or (1,)), (g.shape, w.shape)
        assert np.array_equal(g.reshape(w.shape), w.astype(np.int64)), (g, w)
    return graph


def ops_of(graph) -> dict[str, int]:
    return graph.op_counts()


def runs(m, shape) -> bool:
    """Whether onnxruntime runs the model to non-empty outputs (a drawn geometry may leave none, or be refused)."""
    try:
        onnx.shape_inference.infer_shapes(m, strict_mode=True)
        outs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": np.zeros(shape, np.int32)})
    except Exception:  # noqa: BLE001
        return False
    return all(o.size for o in outs)


def data(draw, shape, p, dtype=np.int32):
    return draw(tensors(shape, p)).astype(dtype)


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


# -- elementwise ------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), shapes, st.sampled_from(["Add", "Sub", "Mul"]), st.integers(1, 16))
def test_arithmetic_with_broadcast_constant(d, shape, op, p):
    c = d.draw(tensors(shape[d.draw(st.integers(0, len(shape) - 1)):], 12))
    x = data(d.draw, shape, p)
    first = d.draw(st.booleans())
    check(model([node(op, ["x", "c"] if first else ["c", "x"])], shape, inits={"c": c}), x, p)


@SETTINGS
@given(st.data(), shapes)
def test_arithmetic_of_the_input_with_itself_in_int8(d, shape):
    """int8 x + x and x * x wrap in ONNX beyond 127: imported only when the declared precision proves they do not."""
    x = data(d.draw, shape, 4, np.int8)
    m = model([node("Add", ["x", "x"], "s"), node("Mul", ["s", "x"])], shape, T.INT8, T.INT8)
    assert "broadcast_mul" in ops_of(check(m, x, 4))
    with pytest.raises(UnsupportedError, match="outside int8"):
        from_onnx(m, input_precision=5)


@SETTINGS
@given(st.data(), shapes, st.integers(1, 31))
def test_div_truncates(d, shape, p):
    c = d.draw(tensors(shape[-1:], 6).filter(lambda v: (v != 0).all()))
    x = data(d.draw, shape, p)
    check(model([node("Div", ["x", "c"])], shape, inits={"c": c}), x, p)
    # a divisor that cannot be 0: |x| + 1
    m = model([node("Abs", ["x"], "a"), node("Add", ["a", "one"], "b"), node("Div", ["c", "b"])], shape,
              inits={"one": np.array(1, np.int32), "c": np.array([-7, 100, 0, 9][: shape[-1]] * 1, np.int32)
                     if shape[-1] <= 4 else np.array(5, np.int32)})
    check(m, x, p)


@SETTINGS
@given(st.data(), shapes, st.integers(1, 32))
def test_unary_and_extrema(d, shape, p):
    x = data(d.draw, shape, p)
    c = d.draw(tensors(shape[-1:], p))
    nodes = [node("Neg", ["x"], "n"), node("Abs", ["x"], "a"), node("Relu", ["x"], "r"),
             node("Max", ["n", "a", "c"], "mx"), node("Min", ["r", "c"], "mn"),
             node("Greater", ["x", "c"], "g"), node("Less", ["x", "c"], "l")]
    nodes += [node("Cast", [k], f"{k}32", to=T.INT32) for k in ("g", "l")]
    outs = ["n", "a", "r", "mx", "mn", "g32", "l32"]
    check(model(nodes, shape, inits={"c": c}, outputs=outs), x, p)


@SETTINGS
@given(st.data(), shapes, st.integers(2, 20), st.integers(-300, 300), st.integers(0, 600))
def test_clip(d, shape, p, lo, width):
    x = data(d.draw, shape, p)
    b = bound(min(p, 9))
    nodes = [node("Clip", ["x", "lo", "hi"], "y"), node("Clip", ["x", "", "hi"], "z"),
             node("Clip", ["x", "nb", "b"], "w")]
    inits = {"lo": np.array(lo, np.int32), "hi": np.array(lo + width, np.int32), "nb": np.array(-b, np.int32),
             "b": np.array(b, np.int32)}
    check(model(nodes, shape, inits=inits, outputs=("y", "z", "w")), x, p)


def test_clip_to_a_precision_is_cvm_clip_and_the_input_clamp_disappears():
    x = np.array([[-128, -127, -3, 0, 50, 127]], np.int32)
    inits = {"b7": np.array(-63, np.int32), "t7": np.array(63, np.int32), "lo": np.array(-127, np.int32),
             "hi": np.array(127, np.int32)}
    m = model([node("Clip", ["x", "lo", "hi"], "c"), node("Clip", ["c", "b7", "t7"])], x.shape, inits=inits)
    graph = from_onnx(m)
    assert ops_of(graph) == {"cvm_clip": 1} and graph.nodes[-1].attrs["precision"] == 7
    check(m, np.clip(x, -127, 127))


@SETTINGS
@given(st.data(), shapes, st.integers(1, 12))
def test_where_broadcasts_every_operand(d, shape, p):
    x = data(d.draw, shape, p)
    y = d.draw(tensors(shape[-1:], 12))
    m = model([node("Greater", ["x", "zero"], "cond"), node("Where", ["cond", "x", "y"], "w"),
               node("Where", ["cond", "y", "x"], "v")], shape,
              inits={"zero": np.array(0, np.int32), "y": y}, outputs=("w", "v"))
    check(m, x, p)


@SETTINGS
@given(st.data(), shapes, st.integers(1, 7))
def test_casts_that_keep_every_value(d, shape, p):
    x = data(d.draw, shape, p, np.int8)
    m = model([node("Cast", ["x"], "a", to=T.INT64), node("Cast", ["a"], "b", to=T.FLOAT),
               node("Cast", ["b"], "c", to=T.INT16), node("Cast", ["c"], "d", to=T.BOOL),
               node("Cast", ["d"], "y", to=T.INT32), node("Cast", ["x"], "z", to=T.INT32)], shape, x_type=T.INT8,
              outputs=("y", "z"))
    check(m, x, p)
    narrowing = model([node("Cast", ["x"], "y", to=T.INT8)], shape)
    with pytest.raises(UnsupportedError, match="outside int8"):
        from_onnx(narrowing, input_precision=9)


# -- products -----------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.booleans())
def test_matmul_with_a_constant_right_operand(d, m_, k, n, batched):
    shape = (2, m_, k) if batched else (m_, k)
    w = d.draw(tensors((k, n), 8))
    x = data(d.draw, shape, 8)
    check(model([node("MatMul", ["x", "w"])], shape, inits={"w": w}), x)
    check(model([node("MatMul", ["x", "v"])], shape, inits={"v": w[:, 0]}), x)
    if not batched:  # a variable right operand: x @ x^T
        check(model([node("Transpose", ["x"], "t"), node("MatMul", ["x", "t"])], shape), x)


@SETTINGS
@given(st.data(), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4))
def test_matmul_integer_with_zero_points(d, m_, k, n):
    """uint8 data (declared 8 bits: 0..127) minus its zero point times uint8 weights minus theirs, in int32; with
    9 bits (0..255) the data minus its zero point may pass 127, which CVM's dense refuses."""
    x = (d.draw(tensors((m_, k), 7)) + 63).astype(np.uint8)
    w = (d.draw(tensors((k, n), 7)) + 64).astype(np.uint8)
    m = model([node("MatMulInteger", ["x", "w", "xz", "wz"])], (m_, k), x_type=T.UINT8,
              inits={"w": w, "xz": np.array(60, np.uint8), "wz": np.array(64, np.uint8)})
    check(m, x, 8)
    with pytest.raises(UnsupportedError, match="8-bit"):
        from_onnx(m, 9)


@SETTINGS
@given(st.data(), st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.booleans(), st.booleans(),
       st.sampled_from([0, 1, 3]), st.sampled_from([1, -2]))
def test_gemm(d, m_, k, n, trans_a, trans_b, beta, alpha):
    """float Gemm on integer values (Cast in and out): exact as every partial sum stays below 2^24."""
    a_shape = (k, m_) if trans_a else (m_, k)
    w = d.draw(tensors((n, k) if trans_b else (k, n), 8)).astype(np.float32)
    c = d.draw(tensors(d.draw(st.sampled_from([(n,), (1, n), (m_, n)])), 10)).astype(np.float32)
    m = model([node("Cast", ["x"], "f", to=T.FLOAT), node("Gemm", ["f", "w", "c"], "g", transA=int(trans_a),
                                                          transB=int(trans_b), beta=float(beta), alpha=float(alpha)),
               node("Cast", ["g"], "y", to=T.INT32)], a_shape, inits={"w": w, "c": c})
    check(m, data(d.draw, a_shape, 8))


# -- convolution and pooling --------------------------------------------------------------------------------------
PAD_MODES = ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]


@settings(max_examples=30, deadline=None)
@given(st.data(), st.sampled_from(PAD_MODES), st.booleans())
def test_conv_every_padding(d, auto_pad, one_d):
    """float Conv carrying integers (asymmetric pads, auto_pad, strides, dilations, groups, bias, 1-D) -> conv2d
    with symmetric padding and a strided_slice."""
    g = d.draw(st.sampled_from([1, 2]))
    c, oc = g * d.draw(st.integers(1, 2)), g * d.draw(st.integers(1, 2))
    spatial = 1 if one_d else 2
    size = tuple(d.draw(st.integers(3, 7)) for _ in range(spatial))
    k = tuple(d.draw(st.integers(1, 3)) for _ in range(spatial))
    dilate = auto_pad in ("NOTSET", "VALID")  # onnxruntime refuses dilations with SAME_*
    attrs = dict(strides=[d.draw(st.integers(1, 3)) for _ in range(spatial)],
                 dilations=[d.draw(st.integers(1, 2)) if dilate else 1 for _ in range(spatial)], group=g,
                 kernel_shape=list(k))
    if auto_pad == "NOTSET":
        attrs["pads"] = [d.draw(st.integers(0, 3)) for _ in range(2 * spatial)]
    else:
        attrs["auto_pad"] = auto_pad
    pads = attrs.get("pads", [0] * 2 * spatial)
    assume(auto_pad.startswith("SAME") or all(n + pads[i] + pads[i + spatial] >= attrs["dilations"][i] * (kk - 1) + 1
                                              for i, (n, kk) in enumerate(zip(size, k))))
    w = d.draw(tensors((oc, c // g) + k, 8)).astype(np.float32)
    b = d.draw(tensors((oc,), 16)).astype(np.float32)
    shape = (1, c) + size
    m = model([node("Cast", ["x"], "f", to=T.FLOAT), node("Conv", ["f", "w", "b"], "g", **attrs),
               node("Cast", ["g"], "y", to=T.INT32)], shape, inits={"w": w, "b": b})
    if runs(m, shape):
        assert "conv2d" in ops_of(check(m, data(d.draw, shape, 8)))


def test_conv_asymmetric_pads_use_one_symmetric_conv_and_a_slice():
    w = np.arange(-4, 5, dtype=np.float32).reshape(1, 1, 3, 3)
    m = model([node("Cast", ["x"], "f", to=T.FLOAT), node("Conv", ["f", "w"], "g", pads=[0, 2, 1, 0], strides=[2, 2]),
               node("Cast", ["g"], "y", to=T.INT32)], (1, 1, 6, 5), inits={"w": w})
    graph = check(m, np.arange(30, dtype=np.int32).reshape(1, 1, 6, 5) - 15)
    assert ops_of(graph) == {"conv2d": 1, "strided_slice": 1}


@SETTINGS
@given(st.data())
def test_conv_integer(d):
    """uint8 data (declared 8 bits: 0..127) and weights, minus their zero points; padding counts as the zero point."""
    x = (d.draw(tensors((1, 2, 4, 4), 7)) + 64).astype(np.uint8)
    w = (d.draw(tensors((3, 2, 2, 2), 7)) + 100).astype(np.uint8)
    m = model([node("ConvInteger", ["x", "w", "xz", "wz"], pads=[1, 0, 0, 1])], x.shape, x_type=T.UINT8,
              inits={"w": w, "xz": np.array(3, np.uint8), "wz": np.array(100, np.uint8)})
    check(m, x, 8)


@settings(max_examples=30, deadline=None)
@given(st.data(), st.sampled_from(PAD_MODES + ["CEIL"]), st.sampled_from([T.INT8, T.FLOAT]))
def test_max_pool_every_padding(d, auto_pad, dtype):
    size = (d.draw(st.integers(2, 7)), d.draw(st.integers(2, 7)))
    k = [d.draw(st.integers(1, 3)), d.draw(st.integers(1, 3))]
    attrs = dict(kernel_shape=k, strides=[d.draw(st.integers(1, 3)) for _ in range(2)])
    if auto_pad in ("NOTSET", "CEIL"):
        attrs["pads"] = [d.draw(st.integers(0, kk - 1)) for kk in k + k]
        attrs["ceil_mode"] = int(auto_pad == "CEIL")
    else:
        attrs["auto_pad"] = auto_pad
    pads = attrs.get("pads", [0] * 4)
    # a kernel larger than the padded input has no ONNX output (onnxruntime still makes one, truncating)
    assume(auto_pad.startswith("SAME") or all(n + pads[i] + pads[i + 2] >= kk
                                              for i, (n, kk) in enumerate(zip(size, k))))
    shape = (1, 2) + size
    m = model([node("Cast", ["x"], "f", to=dtype), node("MaxPool", ["f"], "p", **attrs),
               node("Cast", ["p"], "y", to=T.INT32)], shape)
    if runs(m, shape):
        check(m, data(d.draw, shape, 8))


# -- resizing ---------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.sampled_from(["half_pixel", "asymmetric", "pytorch_half_pixel", "tf_half_pixel_for_nn",
                                   "align_corners"]),
       st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
def test_resize_nearest_integer_scales(d, transform, rounding):
    sh, sw = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 3))
    shape = (1, 2, d.draw(st.integers(1, 4)), d.draw(st.integers(1, 4)))
    m = model([node("Resize", ["x", "", "s"], mode="nearest", coordinate_transformation_mode=transform,
                    nearest_mode=rounding)], shape, inits={"s": np.array([1, 1, sh, sw], np.float32)})
    x = data(d.draw, shape, 8)
    assert set(ops_of(from_onnx(m))) <= {"upsampling", "repeat", "take"}
    check(m, x)


def test_upsample_opset9_and_resize_by_sizes():
    x = np.arange(-6, 6, dtype=np.int32).reshape(1, 1, 3, 4)
    m = model([node("Upsample", ["x", "s"], mode="nearest")], x.shape, inits={"s": np.array([1, 1, 2, 2], np.float32)},
              opset=9)
    assert ops_of(check(m, x)) == {"upsampling": 1}
    m = model([node("Resize", ["x", "", "", "sz"], mode="nearest", coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor")], x.shape, inits={"sz": np.array([2, 1, 3, 12], np.int64)})
    assert ops_of(check(m, x)) == {"repeat": 2}


# -- data movement ------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple))
def test_reshape_family(d, shape):
    """Reshape (0, -1), Flatten, Squeeze, Unsqueeze, Transpose, and a Shape -> Gather -> Concat -> Reshape chain."""
    rank = len(shape)
    perm = d.draw(st.permutations(range(rank)))
    nodes = [node("Reshape", ["x", "s"], "r"), node("Flatten", ["x"], "f", axis=d.draw(st.integers(-rank, rank))),
             node("Unsqueeze", ["x", "ax"], "u"), node("Squeeze", ["u", "ax"], "q"),
             node("Transpose", ["x"], "t", perm=perm),
             node("Shape", ["x"], "sh"), node("Gather", ["sh", "zero"], "n0", axis=0),
             node("Concat", ["n0", "minus1"], "target", axis=0), node("Reshape", ["t", "target"], "rt")]
    inits = {"s": np.array([0, -1], np.int64), "ax": np.array([d.draw(st.integers(-rank - 1, rank))], np.int64),
             "zero": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    check(model(nodes, shape, inits=inits, outputs=("r", "f", "q", "t", "rt")), data(d.draw, shape, 8))


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple))
def test_slice_with_onnx_clamping(d, shape):
    """Slice with negative and out-of-range starts/ends and negative steps (ONNX clamps, then strided_slice)."""
    rank = len(shape)
    axes = d.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
    steps = [d.draw(st.sampled_from([-3, -1, 1, 2])) for _ in axes]
    starts = [d.draw(st.sampled_from([-10**9, -7, -2, -1, 0, 1, 3, 10**9])) for _ in axes]
    ends = [d.draw(st.sampled_from([-10**9, -6, -1, 0, 2, 4, 10**9])) for _ in axes]
    m = model([node("Slice", ["x", "b", "e", "a", "st"])], shape,
              inits={"b": np.array(starts), "e": np.array(ends), "a": np.array(axes), "st": np.array(steps)})
    if runs(m, shape):
        check(m, data(d.draw, shape, 8))
    else:
        with pytest.raises(UnsupportedError, match="empty"):
            from_onnx(m)


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.booleans())
def test_gather(d, shape, scalar):
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    idx = np.array(d.draw(st.integers(-n, n - 1))) if scalar else \
        np.array(d.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=5)))
    check(model([node("Gather", ["x", "i"], axis=axis)], shape, inits={"i": idx}), data(d.draw, shape, 8))
    with pytest.raises(UnsupportedError, match="out of range"):
        from_onnx(model([node("Gather", ["x", "i"], axis=axis)], shape, inits={"i": np.array([n])}))


def test_gather_with_variable_indices_into_a_constant_table():
    """A lookup table: the input (declared 3 bits, |x| <= 3, made non-negative) indexes a constant. Declared 5 bits
    (|x| <= 15 > 6), indices ONNX gives no result for (onnxruntime fails the run) are clipped as take clips them."""
    table = np.array([5, -9, 100, 7, -128, 3, 0], np.int32)
    m = model([node("Abs", ["x"], "a"), node("Gather", ["t", "a"])], (2, 3), inits={"t": table})
    check(m, np.array([[-3, 0, 1], [3, 2, -2]], np.int32), 3)
    x = np.array([[-15, 0, 6], [7, 15, -9]], np.int32)
    [got] = execute(from_onnx(m, input_precision=5), {"data": x})
    assert np.array_equal(got, table[np.minimum(np.abs(x), 6)])


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
def test_concat_tile_expand_pad(d, shape):
    rank = len(shape)
    axis = d.draw(st.integers(-rank, rank - 1))
    c = d.draw(tensors(shape, 10))
    reps = [d.draw(st.integers(1, 3)) for _ in shape]
    begin = [d.draw(st.integers(-1 if k > 1 else 0, 2)) for k in shape]
    pads = begin + [d.draw(st.integers(-1 if k - (b < 0) > 1 else 0, 2)) for k, b in zip(shape, begin)]
    nodes = [node("Concat", ["x", "c", "x"], "cat", axis=axis), node("Tile", ["x", "reps"], "tile"),
             node("Expand", ["x", "to"], "exp"), node("Pad", ["x", "pads", "fill"], "pad", mode="constant")]
    inits = {"c": c, "reps": np.array(reps, np.int64), "to": np.array((2,) + (1,) * rank, np.int64),
             "pads": np.array(pads, np.int64), "fill": np.array(d.draw(st.integers(-300, 300)), np.int32)}
    m = model(nodes, shape, inits=inits, outputs=("cat", "tile", "exp", "pad"))
    check(m, data(d.draw, shape, 8))


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), st.booleans(), st.integers(1, 24))
def test_reductions(d, shape, keep, p):
    rank = len(shape)
    axes = d.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank))
    nodes = [node("ReduceSum", ["x", "axes"] if axes else ["x"], "s", keepdims=int(keep)),
             node("ReduceMax", ["x", "axes"] if axes else ["x"], "m", keepdims=int(keep))]
    m = model(nodes, shape, inits={"axes": np.array(axes, np.int64)} if axes else {}, opset=18, outputs=("s", "m"))
    graph = check(m, data(d.draw, shape, p), p)
    assert all(n.attrs.get("axis") for n in graph.nodes if n.op == "max")  # never max's axis=() (starts at 0)


def test_reduce_sum_refuses_sums_past_32_bits():
    """16 values of 27 bits sum within CVM's rule (27 + bits(16) = 32); of 28 bits their sum fits int32 but the
    rule says 33 bits; of 29 bits it may overflow int32 in onnxruntime (which saturates)."""
    m = model([node("ReduceSum", ["x"], keepdims=0)], (4, 4), opset=11)
    assert ops_of(from_onnx(m, input_precision=27)) == {"sum": 1}
    with pytest.raises(UnsupportedError, match="needs 33 bits"):
        from_onnx(m, input_precision=28)
    with pytest.raises(UnsupportedError, match="outside int32"):
        from_onnx(m, input_precision=29)


# -- what is refused, all at once ---------------------------------------------------------------------------------
def test_three_unsupported_ops_are_listed_together():
    """A chain through three ops without a CVM form: each one is reported, with its node name and reason."""
    nodes = [node("Cast", ["x"], "f", to=T.FLOAT), node("Tan", ["f"], "s"), node("Det", ["s"], "sm"),
             node("NonZero", ["sm"], "i"), node("Cast", ["i"], "y", to=T.INT32)]
    with pytest.raises(UnsupportedError) as e:
        from_onnx(model(nodes, (2, 3)))
    assert [(p.where, p.rule) for p in e.value.problems] == [
        ("tan_s (Tan)", "no CVM op for ONNX Tan"), ("det_sm (Det)", "no CVM op for ONNX Det"),
        ("nonzero_i (NonZero)", "no CVM op for ONNX NonZero")]


def test_every_reason_is_reported_in_one_error():
    """No CVM op, a non-integer computation, an attribute value CVM lacks, a precision bound, an opset."""
    nodes = [node("Cast", ["x"], "f", to=T.FLOAT), node("Div", ["f", "two"], "half"),
             node("Resize", ["x", "", "s"], "r", mode="linear"), node("Mul", ["x", "x"], "sq"),
             node("Mul", ["sq", "sq"], "q"), node("Erf", ["f"], "e")]
    inits = {"two": np.array(2, np.float32), "s": np.array([1, 1, 2, 2], np.float32)}
    m = model(nodes, (1, 1, 2, 2), inits=inits, outputs=("half", "r", "q", "e"))
    with pytest.raises(UnsupportedError) as e:
        from_onnx(m, input_precision=12)
    rules = {p.where: p.rule for p in e.value.problems}
    assert set(rules) == {"div_half (Div)", "resize_r (Resize)", "mul_q (Mul)", "erf_e (Erf)"}
    assert "integer division" in rules["div_half (Div)"] and "mode=linear" in rules["resize_r (Resize)"]
    assert "precision bound exceeded" in rules["mul_q (Mul)"] and "no CVM op" in rules["erf_e (Erf)"]
    old = model([node("Add", ["x", "x"])], (2,), opset=6)
    with pytest.raises(UnsupportedError, match="needs opset 7"):
        from_onnx(old)


def test_inputs_must_be_integers_with_static_shapes():
    m = model([node("Relu", ["x"])], (2, 2), T.FLOAT, T.FLOAT)
    with pytest.raises(UnsupportedError, match="the float input is read by Relu"):
        from_onnx(m)
    m.graph.input[0].type.tensor_type.elem_type = T.INT32
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(UnsupportedError, match="static shape"):
        from_onnx(m)


@SETTINGS
@given(st.data(), st.lists(st.integers(2, 4), min_size=3, max_size=3).map(tuple))
def test_opset9_attribute_forms(d, shape):
    """The forms of opset 9: Clip bounds, Slice, Squeeze/Unsqueeze axes, Pad widths, Reduce axes as attributes;
    a Constant shape and an Identity."""
    lo = d.draw(st.integers(-100, 0))
    nodes = [node("Cast", ["x"], "f", to=T.FLOAT), node("Clip", ["f"], "c", min=float(lo), max=float(lo + 50)),
             node("Slice", ["c"], "s", starts=[1, 0], ends=[10, -1], axes=[0, 2]),
             node("Unsqueeze", ["s"], "u", axes=[0]), node("Squeeze", ["u"], "q", axes=[0]),
             node("Pad", ["q"], "p", pads=[0, 1, 0, 0, 0, 2], value=-3.0),
             node("ReduceSum", ["p"], "r", axes=[1], keepdims=0), node("ReduceMax", ["p"], "m", axes=[0, 2]),
             helper.make_node("Constant", [], ["shape"], name="const",
                              value=numpy_helper.from_array(np.array([-1], np.int64))),
             node("Reshape", ["m", "shape"], "flat"), node("Identity", ["flat"], "i")]
    nodes += [node("Cast", [k], f"{k}32", to=T.INT32) for k in ("r", "i")]
    check(model(nodes, shape, opset=9, outputs=("r32", "i32")), data(d.draw, shape, 8))
