"""The CUDA serving form (``to_onnx(..., Target("cuda"))``): exact against the reference executor when run on
onnxruntime's CPU provider (the same integer arithmetic), every node a kernel of onnxruntime's CUDA provider by
its kernel table (``cvm_onnx.runtime.placement``), and, where a GPU is present, the native CUDA kernels against their
oracles and a session's node placement read from its profile."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, reject, settings, strategies as st
from onnx import TensorProto, helper

import cvm_onnx
from cvm_onnx import native
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.serving.flat import clips_as_max_min, element_types
from cvm_onnx.core.batch import batched
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import Problem, RuntimeFailure, UnsupportedError, ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import DOMAIN, library_path
from cvm_onnx.runtime import placement
from cvm_onnx.runtime.bulk import run_many
from cvm_onnx.runtime.sessions import Bound, run, session
from cvm_onnx.serving.target import Target
from support import reduce_case, tensors
from support.native import (geometries, im2col_model, im2col_oracle, int32s, requantize_model, requantize_oracle,
                            step)

from conftest import MODELS, RESNET

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "40"))
CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
NO_CUDA = "onnxruntime offers no CUDAExecutionProvider here (install onnxruntime-gpu on a machine with a GPU)"
pytestmark = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


def off_cuda(model: onnx.ModelProto) -> list[Problem]:
    """``placement.without_cuda_kernel``'s problems, less the native ops' in a build with no CUDA kernels: one made
    without nvcc at install, where none can be (with nvcc, the last test of the group below requires them)."""
    problems = placement.without_cuda_kernel(model)
    if native.cuda_ops(library_path()):
        return problems
    return [p for p in problems if "the native library has no CUDA kernel" not in p.rule]


def weights(shape):
    """Weights of precision 8 (CVM's limit for conv2d and dense), biased to the edges +-127, 0 and +-1."""
    return tensors(shape, 8)


@st.composite
def conv_graphs(draw):
    """A conv2d (random geometry, weights at the int8 edges, optional bias) over data of precision 8, then a
    requantization run, a clip, or two readers (no run: products + bias alone), and its data (extremes
    included), 1-2 samples."""
    (n, c, h, w), kernel, strides, dilations, pads, group = draw(geometries())
    if pads[0] != pads[2] or pads[1] != pads[3]:  # CVM's padding is symmetric
        return draw(conv_graphs())
    oc = group * draw(st.integers(1, 3))
    if draw(st.integers(0, 4)) == 0:  # a per-channel scale
        kernel, strides, pads, group, oc = (1, 1), (1, 1), (0, 0, 0, 0), c, c
    precision = 8
    b = GraphBuilder()
    x = b.input("data", (1, c, h, w), precision)
    inputs = [x, b.param("w", draw(weights((oc, c // group, *kernel))))]
    use_bias = draw(st.booleans())
    if use_bias:
        inputs.append(b.param("b", draw(tensors((oc,), draw(st.sampled_from([8, 20, 31])))), 31))
    y = b.op("conv2d", *inputs, channels=oc, kernel_size=kernel, strides=strides, dilation=dilations,
             padding=pads[:2], groups=group, use_bias=use_bias)
    tail = draw(st.sampled_from(["run", "clip", "two readers"]))
    if tail == "run":
        y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 16)), precision=8))
    elif tail == "clip":
        y = b.op("clip", y, a_min=draw(st.integers(-300, 0)), a_max=draw(st.integers(1, 300)))
    else:
        y = b.op("elemwise_add", b.op("cvm_right_shift", y, shift_bit=2, precision=16),
                 b.op("cvm_clip", y, precision=12))
    graph = b.build(y)
    return (batched(graph, n) if n > 1 else graph), draw(tensors((n, c, h, w), precision))


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=conv_graphs())
def test_the_cuda_form_is_exact_on_the_cpu_provider_and_every_node_has_a_cuda_kernel(case):
    """int8 x int8 products (im2col_int8 + MatMulInteger, |w x| <= 127 * 127) or per-channel scales, then one
    requantize; Max/Min for integer clips: the reference executor's values. No Conv is left."""
    graph, data = case
    model = to_onnx(graph, Target("cuda"))
    assert off_cuda(model) == []
    assert "Conv" not in {n.op_type for n in model.graph.node}
    want = execute(graph, {"data": data})
    got = run(model, {"data": data})
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 3), k=st.integers(1, 40), m=st.integers(1, 5), data=st.data())
def test_a_dense_run_in_the_cuda_form_is_exact(n, k, m, data):
    b = GraphBuilder()
    x = b.input("data", (n, k), 8)
    y = b.op("dense", x, b.param("w", data.draw(weights((m, k)))), units=m, use_bias=False)
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=data.draw(st.integers(1, 8)), precision=8)))
    x = data.draw(tensors((n, k), 8))
    model = to_onnx(graph, Target("cuda"))
    assert off_cuda(model) == []
    assert np.array_equal(run(model, {"data": x})[0], execute(graph, {"data": x})[0])


@pytest.mark.isa
def test_int8_x_int8_products_at_their_largest_sum_are_exact():
    """K = 576 products of 127 * -127 (ResNet-20's widest layer, every operand at the edge): -9,290,304, exact in
    the int32 of MatMulInteger, and the route taken is int8 x int8 with no zero points."""
    b = GraphBuilder()
    x = b.input("data", (1, 64, 3, 3), 8)
    y = b.op("conv2d", x, b.param("w", np.full((2, 64, 3, 3), -127)), channels=2, kernel_size=(3, 3),
             use_bias=False)
    graph = b.build(b.op("cvm_right_shift", y, shift_bit=1, precision=32))
    model = to_onnx(graph, Target("cuda"))
    (mm,) = [node for node in model.graph.node if node.op_type == "MatMulInteger"]
    assert len(mm.input) == 2
    data = np.full((1, 64, 3, 3), 127, np.int32)
    got = run(model, {"data": data})[0]
    assert np.array_equal(got, execute(graph, {"data": data})[0]) and got.min() == (-127 * 127 * 576 + 1) // 2


@settings(max_examples=EXAMPLES, deadline=None)
@given(x=st.lists(int32s, min_size=1, max_size=12), lo=st.one_of(st.none(), int32s), hi=st.one_of(st.none(), int32s))
def test_integer_clips_become_max_and_min_with_the_same_values(x, lo, hi):
    """ONNX Clip is min(max(x, lo), hi) (lo > hi gives hi): the pass keeps it, absent bounds included."""
    inputs = ["x", "" if lo is None else "lo", *([] if hi is None else ["hi"])]
    consts = [onnx.numpy_helper.from_array(np.array(v, np.int32), name)
              for v, name in ((lo, "lo"), (hi, "hi")) if v is not None]
    graph = helper.make_graph([helper.make_node("Clip", inputs, ["y"], name="clip")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.INT32, [len(x)])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [len(x)])], consts)
    model = onnx_model(graph)
    feeds = {"x": np.array(x, np.int32)}
    want = run(model, feeds)[0]
    rewritten = clips_as_max_min(model).model
    assert "Clip" not in {n.op_type for n in rewritten.graph.node}
    assert np.array_equal(run(rewritten, feeds)[0], want)


def test_float_clips_stay():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Clip", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = onnx_model(graph)
    assert [n.op_type for n in clips_as_max_min(model).model.graph.node] == ["Clip"]


# -- reductions and max pooling: onnxruntime's CUDA int32 reductions compare and add in float32 --------------------

def int32_reductions(model: onnx.ModelProto) -> list[str]:
    """The ReduceSum / ReduceMax nodes reading int32 (onnxruntime's CUDA kernels cast them to float32)."""
    types = element_types(model)
    return [n.name for n in model.graph.node if n.op_type in ("ReduceSum", "ReduceMax")
            and types.get(n.input[0]) == TensorProto.INT32]


#: The forms, flat: the function form runs as its inlined bodies, which the flat form writes out.
FORMS = {"flat": dict(inline=True), "serving": dict(target=Target.default()), "cuda": dict(target=Target("cuda"))}


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=reduce_case(), form=st.sampled_from(sorted(FORMS)))
def test_reductions_are_exact_and_wide_ones_take_float64_in_every_form(case, form):
    """sum and max over inputs of any precision: exact on the CPU provider, and, in every form (any may be run
    on CUDA), an int32 ReduceSum / ReduceMax only where every value it sees (partial sums included) is within
    2^24; the CUDA form has a CUDA kernel for every node."""
    name, attrs, p, x = case
    b = GraphBuilder()
    try:
        graph = b.build(b.op(name, b.input("data", x.shape, p), **attrs))
    except ValidationError:  # a sum whose precision would pass 32 bits
        reject()
    model = to_onnx(graph, **FORMS[form])
    if form == "cuda":
        assert off_cuda(model) == []
    count = x.size // max(1, int(np.prod(graph.nodes[-1].outputs[0].shape)))
    if (2 ** (p - 1) - 1) * (count if name == "sum" else 1) > 2**24:
        assert int32_reductions(model) == []
    assert np.array_equal(run(model, {"data": x})[0], execute(graph, {"data": x})[0])


@settings(max_examples=EXAMPLES, deadline=None)
@given(p=st.sampled_from([8, 24, 25, 31, 32]), form=st.sampled_from(sorted(FORMS)), data=st.data())
def test_max_pool2d_is_exact_at_any_precision_in_every_form(p, form, data):
    """Inputs wider than 2^24 pool in float64 in every form (CUDA has no int32 Pad, and its int32 ReduceMax
    compares in float32)."""
    k, s = data.draw(st.sampled_from([(2, 2), (3, 2), (3, 1)])), data.draw(st.integers(1, 2))
    b = GraphBuilder()
    try:
        graph = b.build(b.op("max_pool2d", b.input("data", (1, 2, 5, 5), p), pool_size=k, strides=(s, s),
                             padding=(1, 1), ceil_mode=data.draw(st.booleans())))
    except ValidationError:  # a ceil_mode window that would start in the padding
        reject()
    x = data.draw(tensors((1, 2, 5, 5), p))
    model = to_onnx(graph, **FORMS[form])
    assert int32_reductions(model) == []
    if form == "cuda":
        assert off_cuda(model) == []
    assert np.array_equal(run(model, {"data": x})[0], execute(graph, {"data": x})[0])


# -- batch_inner: the layout that puts a whole batch into one GEMM ------------------------------------------------

def batch_inner_oracle(x, kernel, strides, dilations, pads, group, offset) -> np.ndarray:
    """im2col with batch_inner: the (N, G, K, L) columns as (G, K, N * L)."""
    cols = im2col_oracle(x, kernel, strides, dilations, pads, group, offset)
    n, g, k, positions = cols.shape
    return cols.transpose(1, 2, 0, 3).reshape(g, k, n * positions)


def im2col_case(data, geometry, provider: str, batch_inner: bool):
    shape, kernel, strides, dilations, pads, group = geometry
    wide = not batch_inner and strides == (1, 1) and data.draw(st.booleans())
    op = data.draw(st.sampled_from(["im2col_int8", "im2col_uint8"]))
    x = data.draw(st.one_of(tensors(shape, 8), tensors(shape, 1).map(lambda t: t - 128)))
    model = im2col_model(op, shape, kernel_shape=kernel, strides=strides, dilations=dilations, pads=pads,
                         group=group, **({"wide": 1} if wide else {}), **({"batch_inner": 1} if batch_inner else {}))
    if batch_inner:  # (G, K, N * L): rank 3
        del model.graph.output[0].type.tensor_type.shape.dim[3]
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    (got,) = session(model, provider=provider).run(None, {"x": x})
    offset = 0 if op == "im2col_int8" else 128
    geometry = (kernel, strides, dilations, pads, group)
    want = batch_inner_oracle(x, *geometry, offset) if batch_inner else im2col_oracle(x, *geometry, offset, wide)
    assert np.array_equal(got.astype(np.int64), want)
    assert [d.dim_value for d in inferred.shape.dim] == list(want.shape)


@settings(max_examples=EXAMPLES, deadline=None)
@given(geometry=geometries(), data=st.data())
def test_im2col_batch_inner_puts_every_sample_side_by_side(geometry, data):
    im2col_case(data, geometry, "cpu", batch_inner=True)


@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4), data=st.data(),
       steps=st.lists(step, min_size=1, max_size=5), threads=st.integers(1, 3))
def test_requantize_batch_inner_reads_channel_major_data(shape, data, steps, threads):
    """data (C, N, ...) gives y (N, C, ...), bias and scales per channel (data's axis 0)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    c = shape[0]
    bias = rng.integers(-(1 << 31), 1 << 31, c if data.draw(st.booleans()) else 0, dtype=np.int64).astype(np.int32)
    scales = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, c, dtype=np.int64)] if data.draw(st.booleans()) else []
    model = requantize_batch_inner_model(shape, len(bias), steps, scales)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    got = session(model, threads=threads).run(None, {"x": x, "b": bias})[0]
    want = requantize_oracle(np.ascontiguousarray(x.swapaxes(0, 1)), bias, steps, scales)
    assert np.array_equal(got, want)
    assert [d.dim_value for d in inferred.shape.dim] == [shape[1], shape[0], *shape[2:]]


def requantize_batch_inner_model(shape, channels: int, steps, scales=()) -> onnx.ModelProto:
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[v for s in steps for v in s],
                            batch_inner=1, **({"scales": list(scales)} if scales else {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, shape),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [channels])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [shape[1], shape[0], *shape[2:]])])
    return onnx_model(graph, domains={DOMAIN: 1})


@pytest.mark.parametrize("attrs, message", [(dict(batch_inner=1, width=1), "width and batch_inner"),
                                            (dict(batch_inner=2), "batch_inner must be 0 or 1")])
def test_requantize_refuses_a_batch_inner_it_cannot_take(attrs, message):
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[2, 1, 0], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [None] * 3),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [0])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = onnx_model(graph, domains={DOMAIN: 1})
    with pytest.raises(RuntimeFailure, match=message):
        run(model, {"x": np.zeros((2, 2, 2), np.int32), "b": np.zeros(0, np.int32)})


def test_im2col_refuses_wide_batch_inner_columns():
    model = im2col_model("im2col_int8", [1, 1, 3, 3], kernel_shape=[1, 1], wide=1, batch_inner=1)
    with pytest.raises(RuntimeFailure, match="wide and batch_inner columns do not go together"):
        run(model, {"x": np.zeros((1, 1, 3, 3), np.int32)})


# -- the kernel table and the placement check --------------------------------------------------------------------

MODEL_DIRS = ["digits_cnn", "detection", "transforms", "resnet20"]  # model_dir names (conftest)


def examples() -> list:
    found = [MODELS / name for name in ("digits_cnn", "detection", "transforms")]
    return found + ([RESNET] if (RESNET / "symbol").is_file() else [])


@pytest.mark.parametrize("model_dir", MODEL_DIRS, indirect=True)
@pytest.mark.parametrize("batch", [None, 3])
def test_every_node_of_the_cuda_forms_has_a_cuda_kernel(model_dir, batch):
    """Each example model and ResNet-20, one sample and batched: nothing of the CUDA form falls back to the CPU
    provider; the CPU serving form, for contrast, has int32 Clips."""
    graph = cvm_onnx.load(model_dir).graph
    try:
        model = to_onnx(graph, Target("cuda"), batch=batch)
    except UnsupportedError:  # a model whose ops do not keep a batch axis
        assert batch is not None
        return
    assert off_cuda(model) == []
    assert {p.key: p.value for p in model.metadata_props}["cvm.provider"] == "cuda"
    cpu_form = placement.without_cuda_kernel(to_onnx(graph, Target.default(), batch=batch))
    clamp = "onnxruntime's CUDA Clip takes T in double, float, float16, int64, int8, uint64, uint8; 'data' is int32"
    assert clamp in [p.rule for p in cpu_form]  # the input's clamp (merged with a clip after it on digits_cnn)


@pytest.mark.parametrize("model_dir", MODEL_DIRS, indirect=True)
def test_the_cuda_forms_of_the_examples_are_exact_on_the_cpu_provider(model_dir):
    loaded = cvm_onnx.load(model_dir)
    data = np.load(model_dir / "input.npy").astype(np.int32)
    want = execute(loaded.graph, {"data": data})
    got = run(to_onnx(loaded.graph, Target("cuda")), {"data": data})
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def one_node(op: str, types: list[int], out: int, domain: str = "", **attrs) -> onnx.ModelProto:
    names = [f"x{k}" for k in range(len(types))]
    graph = helper.make_graph([helper.make_node(op, names, ["y"], name="n", domain=domain or None, **attrs)], "g",
                              [helper.make_tensor_value_info(n, t, [2, 2]) for n, t in zip(names, types)],
                              [helper.make_tensor_value_info("y", out, [2, 2])])
    return onnx_model(graph, domains={domain: 1} if domain else None)


@pytest.mark.parametrize("model, why", [
    (one_node("Relu", [TensorProto.INT32], TensorProto.INT32), "CUDA Relu takes T in bfloat16, double, float, float16"),
    (one_node("MatMulInteger", [TensorProto.UINT8, TensorProto.INT8], TensorProto.INT32), "'x0' is uint8"),
    (one_node("BitwiseAnd", [TensorProto.INT32] * 2, TensorProto.INT32), "no CUDA kernel for BitwiseAnd"),
    (one_node("Max", [TensorProto.INT8] * 2, TensorProto.INT8), "'x0' is int8"),
    (one_node("Pad", [TensorProto.INT32, TensorProto.INT64], TensorProto.INT32), "'x0' is int32"),
    (one_node("cvm_unknown", [TensorProto.INT32], TensorProto.INT32, domain=DOMAIN), "no CUDA kernel for cvm.native"),
])
def test_nodes_without_a_cuda_kernel_for_their_types_are_named(model, why):
    (problem,) = placement.without_cuda_kernel(model)
    assert problem.where == "n" and why in problem.rule


def test_the_cpu_serving_form_is_refused_for_cuda_naming_its_channels_last_requantize(resnet_dir):
    """Its requantize nodes with rows/nhwc have a CUDA registration whose kernel refuses them at run time (seen on
    an H200): the placement check names them and a CUDA session is refused before it is made, on any machine."""
    graph = cvm_onnx.load(resnet_dir).graph
    model = to_onnx(graph, Target.default())
    assert any(a.name in ("rows", "nhwc") and (a.i or a.ints) for n in model.graph.node if n.op_type == "requantize"
               for a in n.attribute)
    if not native.cuda_ops(library_path()):
        pytest.skip("this build of the native library has no CUDA kernels")
    refused = placement.cuda_refusals(model)
    assert refused and all("takes no" in p.rule and "provider 'cuda'" in p.rule for p in refused)
    assert set(refused) <= set(placement.without_cuda_kernel(model))
    assert placement.cuda_refusals(to_onnx(graph, Target("cuda"))) == []
    with pytest.raises(RuntimeFailure, match="would fail on CUDA.*takes no"):
        session(model, "cuda")


def test_the_kernel_table_is_well_formed():
    t = placement.table()
    assert t["opset"] == 21 and "OperatorKernels.md" in t["source"] and "commit" in t["source"]
    for op, kernel in t["kernels"].items():
        named = {c.removesuffix("*") for c in kernel["inputs"] + kernel["outputs"]}
        assert named == set(kernel["types"]), op
        assert all(kernel["types"][c] for c in named), op


def test_the_library_registers_the_cuda_kernels_the_placement_check_assumes():
    """With nvcc at install (CI has it) the build must have its CUDA kernels: CVM_ONNX_CUDA=AUTO leaves them out
    quietly when its CUDA probe fails, and that is a regression here, not a skip."""
    path = library_path()
    if shutil.which("nvcc") is None and not native.cuda_ops(path):
        assert native.cuda_ops(path) == ()
        pytest.skip("no nvcc on PATH: the native library was built without CUDA kernels")
    native_ops = {n.op_type for m in examples() for n in to_onnx(cvm_onnx.load(m).graph, Target("cuda")).graph.node
                  if n.domain == DOMAIN}
    assert native_ops and native_ops <= set(native.cuda_ops(path)) 


# -- with a GPU ---------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("model_dir", MODEL_DIRS, indirect=True)
def test_on_a_gpu_every_node_of_the_cuda_form_runs_on_cuda(model_dir, tmp_path):
    """The session's profile says where each node ran: nothing on the CPU provider (and exact)."""
    path = model_dir
    loaded = cvm_onnx.load(path)
    model = to_onnx(loaded.graph, Target("cuda"))
    sess = session(model, provider="cuda", profile=str(tmp_path / "profile"))
    data = np.load(path / "input.npy").astype(np.int32)
    got = sess.run(None, {"data": data})
    placed = placement.profiled_placement(sess.end_profiling())
    assert placed and {p for p in placed.values()} == {"CUDAExecutionProvider"}, json.dumps(placed)
    want = execute(loaded.graph, {"data": data})
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@settings(max_examples=EXAMPLES, deadline=None)
@given(geometry=geometries(), data=st.data())
def test_on_a_gpu_im2col_gathers_every_window(geometry, data):
    im2col_case(data, geometry, "cuda", batch_inner=data.draw(st.booleans()))


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 12), min_size=3, max_size=4), data=st.data(),
       steps=st.lists(step, min_size=1, max_size=40))
def test_on_a_gpu_requantize_applies_its_steps_in_int32(shape, data, steps):
    """Bias, scales or a width, and more steps than one launch takes (32)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    kind = data.draw(st.sampled_from(["bias", "scales", "width", "none", "batch_inner"]))
    if kind == "batch_inner":
        bias = rng.integers(-(1 << 31), 1 << 31, shape[0], dtype=np.int64).astype(np.int32)
        got = session(requantize_batch_inner_model(shape, shape[0], steps), provider="cuda").run(
            None, {"x": x, "b": bias})[0]
        assert np.array_equal(got, requantize_oracle(np.ascontiguousarray(x.swapaxes(0, 1)), bias, steps))
        return
    channels = shape[1] if kind in ("bias", "width") else 0
    bias = rng.integers(-(1 << 31), 1 << 31, channels, dtype=np.int64).astype(np.int32)
    scales = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, shape[1], dtype=np.int64)] if kind == "scales" else []
    width = data.draw(st.integers(1, shape[-1])) if kind == "width" else 0
    model = requantize_model(shape, channels, steps, width, scales)
    got = session(model, provider="cuda").run(None, {"x": x, "b": bias})[0]
    want = requantize_oracle(x[..., :width] if width else x, bias, steps, scales)
    assert np.array_equal(got, want)


# -- data on the device: IO binding (the same calls on the CPU provider) ------------------------------------------

def test_bound_calls_reuse_their_buffers_and_equal_plain_calls():
    """``sessions.Bound`` (static shapes: buffers allocated once per thread, refilled each call) gives what a plain
    ``run`` gives, call after call, from several threads at once; a wrong shape is one clear error."""
    from concurrent.futures import ThreadPoolExecutor

    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    model = to_onnx(batched(graph, 4), Target("cuda"))
    sess = session(model, threads=1)
    bound = Bound(sess)
    assert bound.static and bound.device == "cpu"
    xs = [np.random.default_rng(k).integers(-127, 128, (4, 1, 8, 8)).astype(np.int32) for k in range(6)]
    kept = [x.copy() for x in xs]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda x: bound({"data": x})[0], xs))
    assert all(np.array_equal(x, k) for x, k in zip(xs, kept))  # the inputs are not the bound buffers
    for x, g in zip(xs, got):
        assert np.array_equal(g, run(sess, {"data": x})[0])
    with pytest.raises(RuntimeFailure, match=r"input data is int32 \(2, 1, 8, 8\); the session takes int32 \(4"):
        bound({"data": xs[0][:2]})


def test_bound_calls_with_a_symbolic_dimension_bind_afresh_each_call():
    x = helper.make_tensor_value_info("x", TensorProto.INT32, ["n", 2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, ["n", 2])])
    bound = Bound(session(onnx_model(graph)))
    assert not bound.static
    for n in (1, 3):
        x = np.arange(2 * n, dtype=np.int32).reshape(n, 2)
        assert np.array_equal(bound({"x": x})[0], x + x)


@pytest.mark.parametrize("io_binding", [True, False])
def test_run_many_through_io_binding_equals_the_reference(io_binding):
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    x = np.load(MODELS / "digits_cnn" / "heldout_x.npy")[:37]
    want = run_many(graph, x).arrays[0]
    model = to_onnx(graph, Target("cuda"), batch=8)
    assert np.array_equal(run_many(model, x, chunk=8, io_binding=io_binding).arrays[0], want)


def test_a_cuda_graph_needs_the_cuda_provider():
    model = to_onnx(cvm_onnx.load(MODELS / "digits_cnn").graph, Target("cuda"))
    with pytest.raises(RuntimeFailure, match="a CUDA graph needs provider 'cuda'"):
        run_many(model, np.zeros((1, 1, 8, 8), np.int32), cuda_graph=True)
    with pytest.raises(RuntimeFailure, match="a CUDA graph runs one call at a time; got 2 workers"):
        run_many(model, np.zeros((1, 1, 8, 8), np.int32), provider="cuda", cuda_graph=True, workers=2)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_on_a_gpu_run_many_keeps_the_data_on_the_device_and_is_exact(cuda_graph):
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    x = np.load(MODELS / "digits_cnn" / "heldout_x.npy")[:37]
    model = to_onnx(graph, Target("cuda"), batch=8)
    got = run_many(model, x, chunk=8, provider="cuda", cuda_graph=cuda_graph).arrays[0]
    assert np.array_equal(got, run_many(graph, x).arrays[0])


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_on_a_gpu_requantize_refuses_shift_0():
    """Shift 0 (the CPU kernel's identity step, aligning channel_steps) has no CUDA kernel: refused, not computed."""
    model = requantize_model([1, 2, 3], 0, [(0, 0, 0)])
    with pytest.raises(RuntimeFailure, match="shift 0"):
        run(model, {"x": np.zeros((1, 2, 3), np.int32), "b": np.zeros(0, np.int32)}, provider="cuda")
