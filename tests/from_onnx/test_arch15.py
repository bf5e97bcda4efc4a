"""Graph forms of Longformer's sliding-window attention as torch's TorchScript exporter writes it
(benchmarks/more_architectures.py), each in its minimal ONNX form: a NonZero of a constant (its windows' indices
computed from the input's shape, constants once that shape is fixed) and a Pad by a value off its input's grid (the
value chunks padded with -1)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from support.quantized import Oracle, ort_session, qdq
from test_quantized_fresh_ops import NP, RANGE, draw_x, run, scales, x_types



@settings(max_examples=12, deadline=None)
@given(d=st.data(), x_type=x_types, s=scales, same=st.booleans(), quantized_value=st.booleans())
def test_a_pad_value_off_the_grid_is_its_integer_at_the_output_grid(d, x_type, s, same, quantized_value):
    """Pad of a dequantized x by a value v off x's grid (Longformer pads its value chunks with -1; quantize_static
    gives v as its own DequantizeLinear, or v is a float constant), then QuantizeLinear at x's grid (as
    quantize_static shares it) or another: x's integers requantized (the oracle of the model without the Pad),
    padded with saturate(round_half_even(float32(v) / scale) + zero), as ONNX defines QuantizeLinear of v; the
    padded positions as onnxruntime gives them. Regression: refused 'Pad value ... is not on the input's
    quantization grid'."""
    lo, hi = RANGE[x_type]
    rank = d.draw(st.integers(1, 3))
    shape = tuple(d.draw(st.integers(1, 4)) for _ in range(rank))
    widths = [d.draw(st.integers(0, 3)) for _ in range(2 * rank)]
    z = d.draw(st.integers(lo, hi))
    so, zo = (s, z) if same else (d.draw(scales), d.draw(st.integers(-128, 127)))
    out_type = x_type if same else T.INT8
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so),
             "zo": (NP[x_type] if same else np.int8)(zo), "pads": np.array(widths, np.int64)}
    if quantized_value:  # quantize_static's form: v = (q - zv) sv, float32's rounding of that product
        sv, q = np.float32(d.draw(scales)), np.int8(d.draw(st.integers(-128, 127)))
        v, exact = np.float32(np.float32(q) * sv), int(q) * Fraction(float(sv))
        inits.update(vq=q, vs=sv, vz=np.int8(0))
        value = [h.make_node("DequantizeLinear", ["vq", "vs", "vz"], ["v"])]
    else:
        v = np.float32(d.draw(st.sampled_from([-1.0, 0.3, -1e4, 1e4, 2.5e-3])))
        exact = Fraction(float(v))
        inits["v"] = v
        value = []
    at = exact / Fraction(float(np.float32(s))) + z
    assume(at.denominator != 1 or not lo <= at <= hi)  # off x's grid, or past its type's range
    dq = h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])
    padded = qdq([dq, *value, h.make_node("Pad", ["xf", "pads", "v"], ["p"]),
                  h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])], shape, x_type, inits, out_type)
    plain = qdq([dq, h.make_node("QuantizeLinear", ["xf", "so", "zo"], ["y"])], shape, x_type,
                {k: inits[k] for k in ("s", "z", "so", "zo")}, out_type)
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[0] = hi
    _, [got] = run(padded, x)
    imp, [inner] = run(plain, x)
    [want] = Oracle(plain, imp).run(x)
    assert np.array_equal(inner, np.asarray(want[1]).reshape(inner.shape))
    olo, ohi = RANGE[out_type]
    fill = int(np.clip(np.rint(v / np.float32(so)) + zo, olo, ohi))
    width = list(zip(widths[:rank], widths[rank:]))
    assert np.array_equal(got, np.pad(inner, width, constant_values=fill))
    [ort] = ort_session(padded).run(None, {"x": x.astype(NP[x_type])})
    border = np.pad(np.zeros(shape, bool), width, constant_values=True)
    assert np.array_equal(ort[border], got[border])


@settings(max_examples=20, deadline=None)
@given(d=st.data(), rank=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_a_nonzero_of_a_constant_folds_with_the_nodes_past_it(d, rank, seed):
    """GatherND(x, Transpose(NonZero(c))) of a constant c (random shapes, some or no nonzero values): the
    NonZero, which onnxruntime's optimizer leaves, and the Transpose past it fold (``fold_constants``), and the
    float32 outputs equal the model's on random x. Regression: the NonZero stayed (its output's shape unknown)."""
    from cvm_onnx.app.control_flow import fold_constants

    shape = [d.draw(st.integers(1, 4)) for _ in range(rank)]
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, shape) * rng.integers(0, 2)
    nodes = [h.make_node("NonZero", ["c"], ["nz"]), h.make_node("Transpose", ["nz"], ["at"], perm=[1, 0]),
             h.make_node("GatherND", ["x", "at"], ["y"])]
    g = h.make_graph(nodes, "nonzero", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(c, "c")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    x = rng.normal(size=shape).astype(np.float32)
    [want] = ReferenceEvaluator(m).run(None, {"x": x})
    while fold_constants(m):
        pass
    assert [n.op_type for n in m.graph.node] == ["GatherND"]
    [got] = ReferenceEvaluator(m).run(None, {"x": x})
    assert np.array_equal(got, want)
