"""The cvm.native ops: native library == pure-Python fallback == registry reference kernels == loop oracles.

The oracles below are written from the CVM runtime's FORMAL rules (integer IoU percent in int64 with the
INT64_MAX/100 branch, stable score sort, limits with -1 = none, strict `>` for valid rows, clipped lookups).
"""
from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper
from onnx.shape_inference import InferenceError
from support import HAS_FALLBACK, INT32_MAX, INT32_MIN, needs_fallback
from support.oracles import iou_oracle

from cvm_onnx.core import ops
from cvm_onnx.core.errors import RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import ATTRS, DOMAIN, fallback, library_path, register_schemas
from cvm_onnx.runtime import sessions

P30 = (1 << 29) - 1  # the largest coordinate of the runtime's NMS precision limit (30 bits)
# The native library on the CPU, the fallback where onnxruntime-extensions is installed (always in CI), and the native
# CUDA kernels where onnxruntime offers CUDA.
PATHS = ("native",) + (("fallback",) if HAS_FALLBACK else ()) + \
    (("cuda",) if "CUDAExecutionProvider" in ort.get_available_providers() else ())


def nms_oracle(data, valid_count, max_output_size, iou_threshold, force_suppress, top_k):
    out = np.full_like(data, -1)
    n = data.shape[1]
    for b in range(data.shape[0]):
        t = min(max(int(valid_count[b]), 0), n)
        rows = sorted((data[b, i].tolist() for i in range(t)), key=lambda r: -r[1])  # sorted() is stable
        p_max = t if top_k < 0 else min(t, top_k)
        n_max = t if max_output_size < 0 else min(t, max_output_size)
        kept: list[list[int]] = []
        for row in rows[:p_max]:
            if len(kept) >= n_max:
                break
            if row[0] < 0:
                continue
            if any((force_suppress or k[0] == row[0]) and iou_oracle(k[2:], row[2:]) >= iou_threshold
                   for k in kept):
                continue
            kept.append(row)
        for i, row in enumerate(kept):
            out[b, i] = row
    return out


def valid_counts_oracle(data, score_threshold):
    out = np.full_like(data, -1)
    counts = np.zeros(data.shape[0], np.int32)
    for b in range(data.shape[0]):
        for row in data[b]:
            if row[1] > score_threshold:
                out[b, counts[b]] = row
                counts[b] += 1
    return counts, out


def lut_oracle(indices, table):
    flat = table.reshape(-1).tolist()
    return np.array([flat[min(max(int(i), 0), len(flat) - 1)] for i in indices.reshape(-1)],
                    np.int32).reshape(indices.shape)


# -- models and the three implementations ---------------------------------------------------------------------
def single_node(op: str, inputs, outputs, **attrs) -> onnx.ModelProto:
    """One cvm.native node; inputs/outputs are (name, shape) with int32 elements (shape dims may be names)."""
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, TensorProto.INT32, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.INT32, s) for n, s in outputs])
    return onnx_model(graph, domains={DOMAIN: 1})


def op_model(op: str, attrs: tuple, ranks: tuple = (1, 1)) -> onnx.ModelProto:
    if op == "non_max_suppression":
        return single_node(op, [("data", ["B", "N", 6]), ("valid_count", ["B"])], [("y", ["B", "N", 6])],
                           **dict(attrs))
    if op == "get_valid_counts":
        return single_node(op, [("data", ["B", "N", "K"])], [("valid_count", ["B"]), ("y", ["B", "N", "K"])],
                           **dict(attrs))
    dims = [[f"i{k}" for k in range(ranks[0])], [f"t{k}" for k in range(ranks[1])]]
    return single_node(op, [("indices", dims[0]), ("table", dims[1])], [("y", dims[0])])


@lru_cache(maxsize=8)
def cached_session(path: str, op: str, attrs: tuple, ranks: tuple = (1, 1)):
    return sessions.session(op_model(op, attrs, ranks), provider="cuda" if path == "cuda" else "cpu",
                           native=path != "fallback")


def run_all(op: str, attrs: dict, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """Outputs of the native library, the fallback and the registry's reference kernel; inputs unchanged."""
    before = [x.copy() for x in xs]
    key = tuple(sorted(attrs.items()))
    ranks = tuple(x.ndim for x in xs)
    names = [i.name for i in cached_session("native", op, key, ranks).get_inputs()]
    results = [sessions.run(cached_session(p, op, key, ranks), dict(zip(names, xs))) for p in PATHS]
    cls = ops.get(op)
    typed = {k: bool(v) if k == "force_suppress" else v for k, v in attrs.items()}
    if op == "cvm_lut":
        typed["in_dim"] = xs[1].size
    results.append(cls.run(cls.bind(typed), [x.copy() for x in xs]))
    for x, b in zip(xs, before):
        assert np.array_equal(x, b), "an input was modified"
    return results


def assert_all_equal(results, want: list[np.ndarray]) -> None:
    for who, got in zip(PATHS + ("reference",), results):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == np.int32, (who, g.dtype)
            assert g.shape == w.shape and np.array_equal(g, w), f"{who} differs:\n{g}\nwant\n{w}"


# -- strategies -----------------------------------------------------------------------------------------------
small = st.integers(0, 12)
coords = st.one_of(small, small, st.sampled_from([P30, -P30, 0]), st.integers(-P30, P30))
wild_coords = st.one_of(coords, st.sampled_from([INT32_MIN, INT32_MAX]), st.integers(INT32_MIN, INT32_MAX))
ids = st.one_of(st.sampled_from([0, 1, 2, -1]), st.sampled_from([INT32_MIN, INT32_MAX]))
scores = st.one_of(st.sampled_from([-3, 0, 5, 5, 9]), st.integers(INT32_MIN, INT32_MAX))
limits = st.one_of(st.sampled_from([-1, 0, 1, 2, 3]), st.integers(-3, 14))


@st.composite
def nms_cases(draw, coordinate=coords):
    b, n = draw(st.integers(1, 3)), draw(st.integers(0, 10))
    data = np.concatenate([draw(hnp.arrays(np.int32, (b, n, 1), elements=ids)),
                           draw(hnp.arrays(np.int32, (b, n, 1), elements=scores)),
                           draw(hnp.arrays(np.int32, (b, n, 4), elements=coordinate))], axis=2)
    valid_count = draw(hnp.arrays(np.int32, (b,), elements=st.integers(-2, n + 2)))
    if n >= 2:  # thresholds at and around the IoU of the first two boxes
        near = iou_oracle(data[0, 0, 2:].tolist(), data[0, 1, 2:].tolist()) + draw(st.sampled_from([-1, 0, 1]))
        threshold = draw(st.sampled_from([max(near, 1), 1, 50, 68, 69, 100]))
    else:
        threshold = draw(st.sampled_from([1, 50, 100]))
    attrs = {"max_output_size": draw(limits), "iou_threshold": threshold,
             "force_suppress": draw(st.sampled_from([0, 1])), "top_k": draw(limits)}
    return data, valid_count, attrs


@settings(max_examples=100, deadline=None)
@given(nms_cases())
def test_nms_exact(case):
    data, valid_count, attrs = case
    results = run_all("non_max_suppression", attrs, [data, valid_count])
    assert_all_equal(results, [nms_oracle(data, valid_count, **attrs)])


@settings(max_examples=30, deadline=None)
@given(nms_cases(coordinate=wild_coords))
def test_nms_exact_beyond_precision_30(case):
    """Coordinates over the whole int32 range: every implementation wraps the int32 differences alike."""
    data, valid_count, attrs = case
    with np.errstate(divide="ignore"):  # the reference's division by a zero divisor gives 0, as the oracle
        results = run_all("non_max_suppression", attrs, [data, valid_count])
    assert_all_equal(results, [nms_oracle(data, valid_count, **attrs)])


def nms_rows(rows, **attrs):
    data = np.array([rows], np.int32)
    return run_all("non_max_suppression", {**ATTRS["non_max_suppression"], **attrs},
                   [data, np.array([len(rows)], np.int32)])


@pytest.mark.parametrize("threshold, kept", [(68, 1), (69, 2)])
def test_nms_verified_iou_68(threshold, kept):
    """Two 10x10 boxes offset by 1: IoU = 8100 // 119 = 68 (verified on the runtime): 68 suppresses, 69 keeps."""
    rows = [[0, 9, 0, 0, 10, 10], [0, 8, 1, 1, 11, 11]]
    want = np.full((1, 2, 6), -1, np.int32)
    want[0, :kept] = rows[:kept]
    assert_all_equal(nms_rows(rows, iou_threshold=threshold), [want])


@pytest.mark.parametrize("threshold, kept", [(50, 1), (51, 2)])
def test_nms_iou_large_boxes_branch(threshold, kept):
    """overlap > INT64_MAX/100: the runtime divides the union by 100 first.

    A = Q x Q and B = (Q-1) x (2Q-1) share a corner: overlap o = Q(Q-1), union u = 2Q^2 - 2Q + 1, and
    100*o = 50*u - 50, so the exact percent is 49; u = 1 (mod 100) makes the runtime's o // (u // 100) exactly 50.
    """
    q, c = 400_000_000, -P30
    rows = [[0, 9, c, c, c + q, c + q], [0, 8, c, c, c + q - 1, c + 2 * q - 1]]
    assert iou_oracle(rows[0][2:], rows[1][2:]) == 50
    want = np.full((1, 2, 6), -1, np.int32)
    want[0, :kept] = rows[:kept]
    assert_all_equal(nms_rows(rows, iou_threshold=threshold), [want])


def test_nms_ties_keep_input_order_and_skip_negative_ids():
    rows = [[1, 5, 0, 0, 1, 1], [-1, 9, 0, 0, 1, 1], [2, 5, 5, 5, 6, 6], [1, 5, 0, 0, 1, 1], [3, 7, 9, 9, 10, 10]]
    want = np.array([[[3, 7, 9, 9, 10, 10], [1, 5, 0, 0, 1, 1], [2, 5, 5, 5, 6, 6]] + [[-1] * 6] * 2], np.int32)
    assert_all_equal(nms_rows(rows), [want])


@st.composite
def valid_counts_cases(draw):
    b, n, k = draw(st.integers(1, 3)), draw(st.integers(0, 8)), draw(st.integers(2, 7))
    threshold = draw(st.one_of(st.integers(-5, 5), st.sampled_from([INT32_MIN, INT32_MAX - 1])))
    near = st.sampled_from([threshold - 1, threshold, threshold + 1]).map(lambda v: min(max(v, INT32_MIN), INT32_MAX))
    cell = st.one_of(st.integers(-9, 9), st.sampled_from([INT32_MIN, INT32_MAX]))
    data = draw(hnp.arrays(np.int32, (b, n, k), elements=cell))
    data[:, :, 1] = draw(hnp.arrays(np.int32, (b, n), elements=st.one_of(near, cell)))
    return data, {"score_threshold": threshold}


@settings(max_examples=80, deadline=None)
@given(valid_counts_cases())
def test_get_valid_counts_exact(case):
    data, attrs = case
    results = run_all("get_valid_counts", attrs, [data])
    assert_all_equal(results, list(valid_counts_oracle(data, attrs["score_threshold"])))


def test_get_valid_counts_threshold_is_strict():
    data = np.array([[[0, 4, 1], [1, 5, 2], [2, 6, 3]], [[3, 5, 4], [4, 5, 5], [5, 5, 6]]], np.int32)
    want_count = np.array([1, 0], np.int32)
    want = np.full_like(data, -1)
    want[0, 0] = [2, 6, 3]
    assert_all_equal(run_all("get_valid_counts", {"score_threshold": 5}, [data]), [want_count, want])


@st.composite
def lut_cases(draw):
    table_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
    size = int(np.prod(table_shape))
    table = draw(hnp.arrays(np.int32, table_shape, elements=st.integers(INT32_MIN, INT32_MAX)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    index = st.one_of(st.integers(-3, size + 3), st.sampled_from([INT32_MIN, INT32_MAX, -1, size, size - 1]))
    return draw(hnp.arrays(np.int32, shape, elements=index)), table


@settings(max_examples=80, deadline=None)
@given(lut_cases())
def test_cvm_lut_exact(case):
    indices, table = case
    assert_all_equal(run_all("cvm_lut", {}, [indices, table]), [lut_oracle(indices, table)])


def test_cvm_lut_verified_example():
    """Notes: indices [-3, 0, 2, 9] into [10, 20, 30, 40] give [10, 10, 30, 40]."""
    got = run_all("cvm_lut", {}, [np.array([-3, 0, 2, 9], np.int32), np.array([10, 20, 30, 40], np.int32)])
    assert_all_equal(got, [np.array([10, 10, 30, 40], np.int32)])


# -- which implementation runs ----------------------------------------------------------------------------------
NMS_MODEL = op_model("non_max_suppression", ())
NMS_FEEDS = {"data": np.array([[[0, 9, 0, 0, 10, 10], [0, 8, 1, 1, 11, 11]]], np.int32),
             "valid_count": np.array([2], np.int32)}


def test_native_library_runs_in_the_normal_install(monkeypatch):
    """The install built the library, and sessions run cvm.native nodes with it, never touching the fallback."""
    assert library_path() is not None, "the native custom-op library was not built"

    def no_fallback(*args):
        raise AssertionError("the fallback was used")

    monkeypatch.setattr(fallback, "library", no_fallback)
    monkeypatch.setattr(fallback, "to_fallback", no_fallback)
    [y] = sessions.run(NMS_MODEL, NMS_FEEDS)
    assert np.array_equal(y[0, 0], NMS_FEEDS["data"][0, 0]) and (y[0, 1] == -1).all()  # IoU 68 >= 50
    any_rows = single_node("non_max_suppression", [("data", ["B", "N", "K"]), ("valid_count", ["B"])],
                           [("y", ["B", "N", "K"])])
    with pytest.raises(RuntimeFailure, match=r"non_max_suppression: data must have shape \(B, N, 6\), got \(1, 2, 5\)"):
        sessions.run(any_rows, {**NMS_FEEDS, "data": NMS_FEEDS["data"][:, :, :5].copy()})  # the C++ kernel's check


@needs_fallback
def test_missing_library_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(sessions, "library_path", lambda: None)
    with pytest.warns(RuntimeWarning, match="fallback"):
        sess = sessions.session(NMS_MODEL)
    [y] = sessions.run(sess, NMS_FEEDS)
    assert np.array_equal(y[0, 0], NMS_FEEDS["data"][0, 0]) and (y[0, 1] == -1).all()
    with pytest.raises(RuntimeFailure, match="not built"):
        sessions.session(NMS_MODEL, native=True)


@pytest.mark.filterwarnings("ignore:the native custom-op library was not built:RuntimeWarning")
def test_the_fallback_without_onnxruntime_extensions_says_what_to_install(monkeypatch):
    """The fallback imports onnxruntime-extensions only when it runs; without it, one error names the package."""
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)  # import onnxruntime_extensions raises ImportError
    monkeypatch.setattr(sessions, "library_path", lambda: None)
    for native in (None, False):
        with pytest.raises(UnsupportedError, match=r"fallback needs onnxruntime-extensions, the extra fallback "
                                                   r"\(pip install onnxruntime-extensions\)"):
            sessions.session(NMS_MODEL, native=native)


def test_fallback_rewrite_writes_every_attribute():
    model = fallback.to_fallback(op_model("non_max_suppression", (("top_k", 3),)))
    [node] = model.graph.node
    assert (node.domain, node.op_type) == (fallback.DOMAIN, "CvmNonMaxSuppression")
    assert {a.name: a.i for a in node.attribute} == {**ATTRS["non_max_suppression"], "top_k": 3}
    assert {o.domain for o in model.opset_import} == {"", fallback.DOMAIN}
    assert not fallback.uses_native(model)
    bad = op_model("non_max_suppression", (("top_k", 3),))
    bad.graph.node[0].op_type = "nms"
    with pytest.raises(RuntimeFailure, match="unknown op"):
        fallback.to_fallback(bad)


def test_native_rejects_a_float_attribute():
    model = single_node("non_max_suppression", [("data", [1, 2, 6]), ("valid_count", [1])], [("y", [1, 2, 6])],
                        iou_threshold=0.5)
    with pytest.raises(RuntimeFailure, match="iou_threshold must be an int"):
        sessions.session(model, native=True)


def test_cuda_needs_the_cuda_provider():
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    with pytest.raises(RuntimeFailure, match="onnxruntime-gpu"):
        sessions.session(NMS_MODEL, provider="cuda")


def test_onnxruntime_loads_the_chosen_opset_and_ir_version():
    """Opset 21 (what every onnxruntime from 1.20 on reads) and the IR version it needs, never the installed onnx's newest."""
    from cvm_onnx.core.format.onnx_file import ir_version

    sessions.check_onnxruntime()
    assert (sessions.OPSET, sessions.IR_VERSION) == (21, ir_version([helper.make_opsetid("", 21)])) == (21, 10)


@needs_fallback
def test_onnxruntime_is_probed_once(monkeypatch):
    """session() asks onnxruntime about the versions once per process, not once per session (the probe is the
    one-node graph named "probe")."""
    made = []

    def counting(model, *args, **kwargs):
        made.append(onnx.load_from_string(model).graph.name)
        return real(model, *args, **kwargs)

    real = ort.InferenceSession
    monkeypatch.setattr(sessions.ort, "InferenceSession", counting)
    for _ in range(3):
        sessions.session(NMS_MODEL, native=False)
    assert made.count("probe") <= 1 and len(made) - made.count("probe") == 3


def test_messages_do_not_keep_exceptions():
    """one_line keeps no reference to the exceptions it reads (a cache of them kept every one alive)."""
    import gc
    import weakref

    class Refusal(Exception):  # a subclass: built-in exceptions take no weak references
        pass

    e = Refusal("a\nb")
    assert sessions.one_line(e) == "a b"
    ref = weakref.ref(e)
    del e
    gc.collect()
    assert ref() is None


# -- schemas: checker and strict shape inference ----------------------------------------------------------------
def infer(model: onnx.ModelProto) -> dict[str, list[int]]:
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(inferred.graph.value_info) + list(inferred.graph.output)}


def with_unknown_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with output shapes erased, so inference has to produce them."""
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    return model


def test_schemas_check_and_infer_shapes():
    register_schemas()  # idempotent: already registered at import
    nms = single_node("non_max_suppression", [("data", [2, 7, 6]), ("valid_count", [2])], [("y", [2, 7, 6])],
                      max_output_size=3, iou_threshold=40, force_suppress=1, top_k=5)
    assert infer(nms)["y"] == [2, 7, 6]
    gvc = single_node("get_valid_counts", [("data", [3, 4, 5])], [("c", [3]), ("y", [3, 4, 5])], score_threshold=2)
    assert infer(gvc) == {"c": [3], "y": [3, 4, 5]}
    lut = single_node("cvm_lut", [("indices", [2, 3]), ("table", [256])], [("y", [2, 3])])
    assert infer(lut)["y"] == [2, 3]
    for model in (nms, gvc, lut):
        inferred = onnx.shape_inference.infer_shapes(with_unknown_outputs(model), strict_mode=True)
        for out in inferred.graph.output:
            assert out.type.tensor_type.elem_type == TensorProto.INT32


@pytest.mark.parametrize("model, error", [
    (single_node("non_max_suppression", [("data", [1, 4, 5]), ("valid_count", [1])], [("y", [1, 4, 5])]),
     "6 values"),
    (single_node("non_max_suppression", [("data", [2, 4, 6]), ("valid_count", [3])], [("y", [2, 4, 6])]),
     "batch size"),
    (single_node("get_valid_counts", [("data", [1, 4])], [("c", [1]), ("y", [1, 4])]), "3-D"),
    (single_node("cvm_lut", [("indices", [3]), ("table", [0])], [("y", [3])]), "empty"),
])
def test_schemas_reject_bad_shapes(model, error):
    with pytest.raises((InferenceError, onnx.checker.ValidationError), match=error):
        infer(model)


@pytest.mark.parametrize("attrs, error", [({"iou_threshold": 0.5}, "Mismatched attribute type"),
                                          ({"coord_start": 2}, "Unrecognized attribute")])
def test_schemas_reject_bad_attributes(attrs, error):
    model = single_node("non_max_suppression", [("data", [1, 4, 6]), ("valid_count", [1])], [("y", [1, 4, 6])],
                        **attrs)
    with pytest.raises(onnx.checker.ValidationError, match=error):
        onnx.checker.check_model(model, full_check=True)


def test_schemas_reject_int64():
    node = helper.make_node("cvm_lut", ["i", "t"], ["y"], domain=DOMAIN)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("i", TensorProto.INT64, [2]),
                                            helper.make_tensor_value_info("t", TensorProto.INT32, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2])])
    model = onnx_model(graph, domains={DOMAIN: 1})
    with pytest.raises((InferenceError, onnx.checker.ValidationError)):
        infer(model)


def test_a_library_that_does_not_load_is_reported_in_one_line(tmp_path, monkeypatch):
    """`cvm-onnx --version`'s lines name a library that does not load, rather than raising (cuda_status raised
    OSError before)."""
    import cvm_onnx.native as native

    broken = tmp_path / "libcvm_onnx_ops.so"
    broken.write_bytes(b"not a shared library")
    monkeypatch.setattr(native, "library_path", lambda: str(broken))
    monkeypatch.setattr(sessions, "library_path", lambda: str(broken))
    assert "does not load" in native.status()
    assert sessions.cuda_status().endswith("native CUDA kernels: not built")


def test_the_step_kinds_are_the_kernels():
    """cvm_onnx.native's step kinds (what the exporter writes in requantize's (kind, a, b) triples) are the
    kernels' StepKind enumerators, read from the C++ sources, so that the two cannot drift apart."""
    import re
    from pathlib import Path

    from cvm_onnx import native

    sources = "\n".join(p.read_text() for p in (Path(__file__).parents[2] / "custom_ops").rglob("*.h"))
    (enum,) = re.findall(r"enum\s+StepKind\b[^{]*\{([^}]*)\}", sources)
    kernels = {name: int(value) for name, value in re.findall(r"(k\w+)\s*=\s*(\d+)", enum)}
    assert kernels == {"kShift": native.SHIFT, "kMul": native.MULTIPLY, "kAdd": native.ADD, "kClip": native.CLIP,
                       "kMul64": native.MUL64, "kEven": native.EVEN}
    assert [native.STEP_KINDS[k] for k in (native.SHIFT, native.MULTIPLY, native.ADD, native.CLIP, native.MUL64,
                                           native.EVEN)] == ["shift", "multiply", "add", "clip", "mul64", "even"]


def test_the_kernels_read_each_attribute_with_its_schemas_default():
    """The one statement of the native ops' interface is their schemas (``native.attributes``): the kernels
    (custom_ops/cvm_ops.cc, read as text) read every attribute a schema names, each with the schema's type and
    default (an absent list empty, a required one refused when empty), and no attribute no schema names."""
    import re
    from pathlib import Path

    from cvm_onnx import native

    here = Path(__file__).parents[2] / "custom_ops"
    ops_cc, headers = (here / "cvm_ops.cc").read_text(), "\n".join(p.read_text() for p in here.glob("*.h"))

    def value(expr: str):
        if expr.startswith("{"):
            return [int(v) for v in re.findall(r"-?\d+", expr)]
        if expr.startswith("k"):  # an enumerator
            return int(re.search(rf"\b{expr}\s*=\s*(-?\d+)", headers)[1])
        if expr.startswith("a."):  # a field's initializer (NmsAttrs)
            return int(re.search(rf"\b{expr[2:]}\s*=\s*(-?\d+);", headers)[1])
        return int(expr)

    reads = re.findall(r'\b(int|ints)_attr\(info, "(\w+)", (-?\d+|\{[-\d, ]*\}|k\w+|a\.\w+)\)', ops_cc)
    assert len(reads) >= 20
    schemas = native.attributes()
    for kind, name, expr in reads:
        stated = {op: attrs[name] for op, attrs in schemas.items() if name in attrs}
        assert stated, f"the kernels read {name}, which no schema names"
        for op, (want_kind, default) in stated.items():
            want = [] if default in (None, native.REQUIRED) else default
            assert (kind, value(expr)) == (want_kind, want), (op, name, expr)
    named = {name for attrs in schemas.values() for name in attrs}
    assert not [n for n in named if f'"{n}"' not in ops_cc]


def test_the_cpu_feature_bits_are_the_librarys():
    """native.cpu.FEATURES (how Python reads cvm_onnx_cpu_features) has the bits of the library's Feature
    enumerators, read from the C++ sources: kAvx2 is avx2's bit, kAvx512Vnni avx512_vnni's, and so on."""
    import re
    from pathlib import Path

    from cvm_onnx.native import cpu

    sources = "\n".join(p.read_text() for p in (Path(__file__).parents[2] / "custom_ops").rglob("*.cc"))
    (enum,) = re.findall(r"enum\s+Feature\b[^{]*\{([^}]*)\}", sources)
    bits = {name: 1 << int(shift) for name, shift in re.findall(r"k(\w+)\s*=\s*1u\s*<<\s*(\d+)", enum)}
    assert {bits[name]: name.lower() for name in bits} == {b: f.replace("_", "") for b, f in cpu.FEATURES.items()}
