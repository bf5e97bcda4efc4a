"""scikit-learn's linear classifiers (LogisticRegression, LinearSVC, SGDClassifier, RidgeClassifier) as skl2onnx
writes them: an ``ai.onnx.ml`` LinearClassifier (one row of coefficients per class, integer labels; post_transform
NONE, LOGISTIC or SOFTMAX), after a StandardScaler's Scaler in a pipeline, before a ZipMap unless converted with
zipmap=False. Before: refused, 'ai.onnx.ml ops (LinearClassifier x1): CVM has none'; now written as Reshape, Gemm,
the post_transform's op, ArgMax and a Gather of the labels (docs/import.md). String labels, other post_transforms,
one row of coefficients and ZipMap's maps stay refused, each in one line naming the node."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import linear_classifier, quantizes_whole, two_orders_bound

from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import feature_extractors_as_gathers, linear_classifier_refusal, linear_classifiers_as_gemms
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model

FLOATS = st.floats(-1e4, 1e4, width=32) | st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.0])
#: |Sigmoid(s) - Sigmoid(t)| <= |s - t| / 4 and |Softmax(s)_i - Softmax(t)_i| <= max |s - t| / 2 (the largest
#: slopes); beside that, the two kernels' own rounding of their exp, a few units of 2^-24 at values <= 1 (2^-20).
SLOPE, OWN_ROUNDING = {"NONE": 1.0, "LOGISTIC": 0.25, "SOFTMAX": 0.5}, 2.0 ** -20


def run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


def drawn(data, shape: tuple[int, ...]) -> np.ndarray:
    size = int(np.prod(shape))
    return np.array(data.draw(st.lists(FLOATS, min_size=size, max_size=size)), np.float32).reshape(shape)


@settings(max_examples=60, deadline=None)
@given(features=st.integers(1, 8), classes=st.integers(2, 5), rows=st.integers(0, 4),
       post=st.sampled_from(sorted(SLOPE)), ordered=st.booleans(), data=st.data())
def test_a_linear_classifier_is_its_gemm_and_argmax(features, classes, rows, post, ordered, data):
    """Property: onnxruntime's LinearClassifier kernel and the rewrite's ops give, of a batch (N, features) or of one
    sample (features,) (rows 0), scores (N, classes) within the sum's rounding (``two_orders_bound``) times the
    post_transform's slope (plus the kernels' rounding of exp), and equal labels wherever the top two exact scores
    are further apart than their two bounds (no tie within the rounding: onnxruntime's kernel and ArgMax both take
    the first largest)."""
    w, b = drawn(data, (classes, features)), drawn(data, (classes,))
    labels = list(range(classes)) if ordered else data.draw(
        st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), min_size=classes, max_size=classes, unique=True))
    m = linear_classifier(w, b, labels, [None, features] if rows else [features], post_transform=post)
    out = onnx.ModelProto()
    out.CopyFrom(m)
    assert linear_classifiers_as_gemms(out.graph) == 1
    assert all(n.domain == "" for n in out.graph.node)
    x = drawn(data, (rows, features) if rows else (features,))
    (got_label, got), (want_label, want) = run(out, x), run(m, x)
    assert got.shape == want.shape == (max(rows, 1), classes) and got_label.shape == want_label.shape == (max(rows, 1),)
    bound = two_orders_bound(x, w, b)
    spread = bound if post == "NONE" else bound.max(axis=1, keepdims=True) if post == "SOFTMAX" else bound
    assert (np.abs(got.astype(np.float64) - want) <= SLOPE[post] * spread + (post != "NONE") * OWN_ROUNDING).all()
    exact = np.atleast_2d(x).astype(np.float64) @ w.T.astype(np.float64) + b
    top = np.argsort(-exact, axis=1, kind="stable")[:, :2]
    rows_of = np.arange(len(exact))
    first, second = top[:, 0], top[:, 1]
    clear = exact[rows_of, first] - exact[rows_of, second] > bound[rows_of, first] + bound[rows_of, second]
    assert (got_label[clear] == want_label[clear]).all()
    assert (want_label[clear] == np.array(labels, np.int64)[first[clear]]).all()


def test_labels_0_to_classes_are_the_argmax_itself():
    """Labels 0, 1, ..., classes - 1 (skl2onnx's for y of 0 .. k-1) need no Gather; others are gathered."""
    w, b = np.ones((3, 2), np.float32), np.zeros(3, np.float32)
    m = linear_classifier(w, b, [0, 1, 2], [None, 2], post_transform="SOFTMAX")
    assert linear_classifiers_as_gemms(m.graph) == 1
    assert [n.op_type for n in m.graph.node] == ["Reshape", "Gemm", "Softmax", "ArgMax"]
    m = linear_classifier(w, b, [3, 1, 2], [None, 2])
    assert linear_classifiers_as_gemms(m.graph) == 1
    assert [n.op_type for n in m.graph.node] == ["Reshape", "Gemm", "ArgMax", "Gather"]


@pytest.mark.parametrize("post, labels", [("SOFTMAX", [2, 5, 9]), ("LOGISTIC", [0, 1, 2, 3]), ("NONE", [7, 1])])
@pytest.mark.parametrize("per_channel", [False, True])
def test_an_sklearn_linear_classifier_quantizes_whole(tmp_path, per_channel, post, labels):
    """A StandardScaler + linear classifier of 6 features (multinomial LogisticRegression: SOFTMAX; one-vs-rest:
    LOGISTIC; LinearSVC binary, as skl2onnx writes it in two rows (-w, w): NONE), zipmap=False: imports whole, its
    scores as close to float as onnxruntime's quantized model (1.1x), its labels too, the export exact. Before:
    refused, 'ai.onnx.ml ops (LinearClassifier x1): CVM has none'."""
    rng = np.random.default_rng(3)
    w, b = rng.normal(size=(len(labels), 6)).astype(np.float32), rng.normal(size=len(labels)).astype(np.float32)
    if len(labels) == 2:
        w[0], b[0] = -w[1], -b[1]
    m = linear_classifier(w, b, labels, [None, 6], scaler=True, post_transform=post)
    quantizes_whole(tmp_path, m, per_channel, rng.normal(size=(8, 1, 6)))


def zipmapped(m: onnx.ModelProto) -> onnx.ModelProto:
    """skl2onnx's default: the scores through a ZipMap of the labels into a sequence of maps."""
    labels = [a for a in m.graph.node[-1].attribute if a.name == "classlabels_ints"][0].ints
    m.graph.node.extend([h.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                                     name="ZipMap", classlabels_int64s=list(labels))])
    del m.graph.output[1:]
    m.graph.output.extend([h.make_value_info("output_probability", h.make_sequence_type_proto(
        h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, []))))])
    return m


def test_a_zipmap_is_refused_saying_convert_with_zipmap_false(tmp_path):
    """skl2onnx's default ZipMap after the scores is refused in one line that names it and says how to convert."""
    m = zipmapped(linear_classifier(np.ones((3, 4), np.float32), np.zeros(3, np.float32), [0, 1, 2], [None, 4]))
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 1, 4)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "ZipMap (ZipMap)" in p.rule and "options={'zipmap': False}" in p.rule and "LinearClassifier" not in p.rule


def test_a_zipmap_cut_off_by_outputs_is_no_matter(tmp_path):
    """quantize's ``outputs`` at the label and the scores cut the ZipMap off: the model imports whole."""
    rng = np.random.default_rng(5)
    m = zipmapped(linear_classifier(rng.normal(size=(3, 4)).astype(np.float32),
                                    rng.normal(size=3).astype(np.float32), [0, 1, 2], [None, 4], scaler=True,
                                    post_transform="SOFTMAX"))
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 1, 4)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", outputs=["label", "probabilities"])
    assert [a.name for a in done.agreements] == ["label", "probabilities"]


@pytest.mark.parametrize("attrs, rows, why", [
    ({"classlabels_strings": ["a", "b", "c"]}, 3, "string class labels"),
    ({"post_transform": "SOFTMAX_ZERO"}, 3, "post_transform SOFTMAX_ZERO"),
    ({"post_transform": "PROBIT"}, 3, "post_transform PROBIT"),
    ({}, 1, "one row of coefficients"),
    ({"classlabels_ints": [0, 1]}, 3, "3 intercepts and 2 integer labels"),
    ({"post_transform": 3}, 3, "its attribute post_transform is of type INT, not STRING"),
    ({"classlabels_ints": [0.5, 1.5, 2.5]}, 3, "its attribute classlabels_ints is of type FLOATS, not INTS")])
def test_other_linear_classifiers_are_refused_in_one_line(tmp_path, attrs, rows, why):
    """A LinearClassifier the rewrite leaves is left as it is and refused in one line naming it and the reason.
    Regression (the fuzzer's attributes of another type than the op's): post_transform 3 was an internal
    AttributeError ('int' object has no attribute 'decode'), labels 0.5, 1.5, 2.5 were read as 0, 1, 2."""
    labels = attrs.pop("classlabels_ints", [0, 1] if rows == 1 else list(range(rows)))
    m = linear_classifier(np.ones((rows, 4), np.float32), np.zeros(rows, np.float32), labels, [None, 4], **attrs)
    if "classlabels_strings" in attrs:
        node = m.graph.node[0]
        node.attribute.remove([a for a in node.attribute if a.name == "classlabels_ints"][0])
        m.graph.output[0].type.tensor_type.elem_type = T.STRING
    assert linear_classifiers_as_gemms(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["LinearClassifier"]
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 1, 4)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "LinearClassifier 'LinearClassifier': " in p.rule and why in p.rule


def test_a_linear_classifier_without_intercepts_is_left_with_its_reason():
    """No intercepts (onnxruntime counts the classes by them): left, the reason given (no division by 0 classes)."""
    m = linear_classifier(np.ones((3, 4), np.float32), np.zeros(3, np.float32), [0, 1, 2], [None, 4])
    node = m.graph.node[0]
    node.attribute.remove([a for a in node.attribute if a.name == "intercepts"][0])
    assert "0 intercepts and 3 integer labels are not one per class" in linear_classifier_refusal(node)
    assert linear_classifiers_as_gemms(m.graph) == 0


def test_an_opset_imported_twice_is_imported_once(tmp_path):
    """skl2onnx 1.20 with zipmap=False imports ai.onnx twice (the same version): one is dropped, the model quantizes
    whole. Regression: 'quantize_static failed: ValueError: Failed to find proper ai.onnx domain'."""
    rng = np.random.default_rng(4)
    m = linear_classifier(rng.normal(size=(2, 5)).astype(np.float32), rng.normal(size=2).astype(np.float32), [0, 1],
                          [None, 5], scaler=True, post_transform="LOGISTIC")
    m.opset_import.extend([h.make_opsetid("", 13)])
    quantizes_whole(tmp_path, m, False, rng.normal(size=(8, 1, 5)))


def feature_extractor(x_shape: list[int], indices: np.ndarray | None, x: np.ndarray | None = None) -> onnx.ModelProto:
    """ArrayFeatureExtractor(X, Y): X the input x of ``x_shape`` (or the constant ``x``), Y the constant ``indices``
    (or the int64 input y)."""
    inputs, inits = [], []
    if x is None:
        inputs.append(h.make_tensor_value_info("x", T.FLOAT, x_shape))
    else:
        inits.append(onnx.numpy_helper.from_array(x, "x"))
    if indices is None:
        inputs.append(h.make_tensor_value_info("y", T.INT64, [None]))
    else:
        inits.append(onnx.numpy_helper.from_array(indices, "y"))
    g = h.make_graph([h.make_node("ArrayFeatureExtractor", ["x", "y"], ["z"], domain="ai.onnx.ml", name="AFE")],
                     "afe", inputs, [h.make_tensor_value_info("z", T.FLOAT, None)], inits)
    return onnx_model(g, 13, {"ai.onnx.ml": 1})


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), count=st.integers(1, 4), matrix=st.booleans(),
       constant_x=st.booleans(), data=st.data())
def test_an_array_feature_extractor_is_a_gather(shape, count, matrix, constant_x, data):
    """Property: onnxruntime's ArrayFeatureExtractor and the rewrite's Gather (axis -1; Unsqueeze of a 1-D X) give
    equal values and shapes, of constant indices (any shape) into an input X of rank 1 to 3, or of indices given at
    run time into a constant X (skl2onnx's pick of a class label by its ArgMax)."""
    idx = np.array(data.draw(st.lists(st.integers(0, shape[-1] - 1), min_size=count, max_size=count)), np.int64)
    idx = idx.reshape(1, -1) if matrix else idx
    x = drawn(data, tuple(shape))
    m = feature_extractor(shape, None, x) if constant_x else feature_extractor(shape, idx)
    feeds = {"y": idx.ravel()} if constant_x else {"x": x}
    out = onnx.ModelProto()
    out.CopyFrom(m)
    assert feature_extractors_as_gathers(out) == 1 and all(n.domain == "" for n in out.graph.node)
    run = [ort.InferenceSession(k.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for k in (out, m)]
    assert run[0].shape == run[1].shape and np.array_equal(run[0], run[1])


@pytest.mark.parametrize("indices", [np.array([-1], np.int64), np.array([4], np.int64), np.array([], np.int64),
                                     np.array([1], np.int32)])
def test_feature_extractors_of_bad_indices_are_left(indices):
    """Constant indices out of [0, X's last dim), none, or not int64 (onnxruntime's kernel refuses them or reads past
    X): left."""
    m = feature_extractor([2, 4], indices)
    assert feature_extractors_as_gathers(m) == 0 and [n.op_type for n in m.graph.node] == ["ArrayFeatureExtractor"]


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_binary_linear_svc_with_its_column_picked_quantizes_whole(tmp_path, per_channel):
    """skl2onnx's binary LinearSVC / RidgeClassifier: LinearClassifier NONE of two rows (-w, w), then
    ArrayFeatureExtractor(scores, [1]), the decision function (N, 1): imports whole, within 1.1x, the export exact.
    Before: refused, 'ai.onnx.ml ops (ArrayFeatureExtractor x1): CVM has none'."""
    rng = np.random.default_rng(6)
    w, b = rng.normal(size=(1, 6)).astype(np.float32), rng.normal(size=1).astype(np.float32)
    m = linear_classifier(np.concatenate([-w, w]), np.concatenate([-b, b]), [0, 1], [None, 6])
    m.graph.node[-1].output[1] = "raw_scores"
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "positive_class_index"))
    m.graph.node.extend([h.make_node("ArrayFeatureExtractor", ["raw_scores", "positive_class_index"],
                                     ["probabilities"], domain="ai.onnx.ml", name="ArrayFeatureExtractor")])
    m.graph.output[1].type.tensor_type.shape.dim[1].dim_value = 1
    quantizes_whole(tmp_path, m, per_channel, rng.normal(size=(8, 1, 6)))


def test_a_normalizer_refused_names_the_cut_before_it(tmp_path):
    """A LinearClassifier SOFTMAX, then a Normalizer MAX (no CVM form here): refused naming the tensor it reads as
    the cut; quantize --outputs there imports whole."""
    rng = np.random.default_rng(8)
    m = linear_classifier(rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                          [0, 1, 2], [None, 4], scaler=True, post_transform="SOFTMAX")
    m.graph.node[-1].output[1] = "probability_tensor"
    m.graph.node.extend([h.make_node("Normalizer", ["probability_tensor"], ["probabilities"], domain="ai.onnx.ml",
                                     norm="MAX")])
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 1, 4)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "ai.onnx.ml ops (Normalizer x1): CVM has none" in p.rule
    assert "--outputs at the tensors they read (probability_tensor) cuts the ai.onnx.ml ops off" in p.rule
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", outputs=["label", "probability_tensor"])
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
